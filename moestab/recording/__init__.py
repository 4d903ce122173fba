"""The recording layer: what one RL step computed, its metrics and its per-token tables, from tensors any trainer
can supply; written through :mod:`moestab.records`. ``moestab train`` and the TRL integration both call it.

Modules: ``batch`` (the token layout of a rollout), ``step_tensors`` (a step's per-token results),
``step_metrics`` (its metrics.jsonl line, via :mod:`moestab.metrics`), ``token_table`` (its per-token table).
"""
