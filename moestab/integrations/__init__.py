"""moestab inside other RL trainers; each integration imports its trainer only when it is imported itself.

- ``moestab.integrations.trl``: TRL's ``GRPOTrainer`` (GRPO and GSPO) writing moestab run folders
  (``pip install 'moestab[trl]'``).
- ``moestab.integrations.verl``: ``route_metrics``, rollout-vs-actor route diagnostics for a verl trainer's metrics.

Routes in from other frameworks' payloads (vLLM, SGLang, verl, Megatron-Core, ...) are :mod:`moestab.routes_in`, a
layer below: ``moestab train``'s vLLM engine places its routes with the same code, and trainers never import
integrations.
"""
