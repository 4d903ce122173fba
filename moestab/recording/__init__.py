"""The recording layer: what one RL step computed, its metrics and its per-token tables, from tensors any trainer
can supply; written through :mod:`moestab.run_folder`. ``moestab train`` and the TRL integration both call it and
re-implement none of it.

Modules: ``batch`` (the token layout of a rollout), ``step_tensors`` (a step's per-token results: routes per source,
log-probs, masks, advantages, rewards), ``step_metrics`` (its metrics.jsonl line: ``step_metrics``, calling the
functions the key table :mod:`moestab.metrics.keys` names), ``token_table`` (its per-token table), ``step_records``
(writing both: ``write_step_tokens``, ``write_step_metrics``), ``trackers`` (what a step sends to experiment trackers,
and the trackers ``--report-to`` opens).
"""
