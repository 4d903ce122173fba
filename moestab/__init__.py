"""moestab: diagnose Mixture-of-Experts routing stability during RL fine-tuning.

Importing the package has no side effects; subpackages are imported on demand:

- ``moestab.models``   the embedded tiny MoE policy and its character tokenizer
- ``moestab.routing``  recording routes (``RoutingRecorder``) and forcing them (``RoutingReplay``)
- ``moestab.rl``       log-probs, ratios, advantages, KL and the registered policy losses
- ``moestab.tasks``    verifiable-reward tasks
- ``moestab.train``    the GSPO/GRPO training loop behind ``moestab train``
- ``moestab.metrics``  the one definition of every metric (numpy), shared by the trainer and the analyzers
- ``moestab.run_folder``  the run-folder format: the only reader and writer of run folders
- ``moestab.analysis`` analyzers over run folders
- ``moestab.integrations`` moestab's records inside other trainers (TRL's GRPOTrainer; optional dependency)
"""

__version__ = "0.1.0"
