"""moestab inside other RL trainers; each integration imports its trainer only when it is imported itself.

- ``moestab.integrations.trl``: TRL's ``GRPOTrainer`` (GRPO and GSPO) writing moestab run folders
  (``pip install 'moestab[trl]'``).
- ``moestab.routes_in``: routes in from vLLM, SGLang, verl, Megatron-Core, NeMo Automodel, prime-rl,
  NeMo-RL, SkyRL, tunix / MaxText and slime payloads, as moestab's ``Routes`` (no framework imported;
  docs/integrations.md).
- ``moestab.integrations.verl``: ``route_metrics``, rollout-vs-actor route diagnostics for a verl trainer's metrics.
"""
