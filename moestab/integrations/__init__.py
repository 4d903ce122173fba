"""moestab inside other RL trainers; each integration imports its trainer only when it is imported itself.

- ``moestab.integrations.trl``: TRL's ``GRPOTrainer`` (GRPO and GSPO) writing moestab run folders
  (``pip install trl``).
"""
