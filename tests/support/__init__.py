"""Helpers shared by the tests, the only module tests import from each other (tests/test_layers.py checks it).

``train``: tiny training configs and one RL step; ``runs``: fake run folders (three builders, each for a different
owner, see its docstring); ``tables``: per-token tables read as pandas users do; ``naive``: plain-Python second
implementations; ``rl``, ``routing``, ``models``, ``probes``, ``trl``, ``route_payloads``, ``dashboard``: inputs and
helpers of those tests; the engines and ``*_worker.py`` scripts of the training tests; ``rewards.py``: the reward
file the tiny task names.
"""
