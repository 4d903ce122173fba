"""The recording layer: what one RL step computed, its metrics and its per-token tables, from tensors any trainer
can supply; written through :mod:`moestab.run_folder`. ``moestab train`` and the TRL integration both call it and
re-implement none of it.

Modules: ``batch`` (the token layout of a rollout), ``step_fields`` (the one declaration of a step's record),
``step_tensors`` (a step's per-token results: routes per source, log-probs, masks, advantages, rewards),
``measurements`` (the forwards that only measure) and ``measure_budget`` (how much of a run they may cost),
``step_metrics`` (its metrics.jsonl line: ``step_metrics``, calling the functions marked with the keys of
:mod:`moestab.metrics.keys`), ``token_table`` (its per-token table), ``step_records`` (writing both:
``write_step_tokens``, ``write_step_metrics``), ``trackers`` (what a step sends to experiment trackers, and the trackers
``--report-to`` opens), ``diagnostics`` (a rollout engine's routes against a trainer's, for any trainer),
``capture_check`` (what a trainer does when its captured routes fail a route-integrity check), ``collapse_watch``
(every trainer's collapse watch: the warning rule fed each step, its keys, what a warning does), ``environment``
(run.json's ``environment``).
"""
