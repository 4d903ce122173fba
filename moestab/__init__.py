"""moestab: diagnose Mixture-of-Experts routing stability during RL fine-tuning.

Importing the package has no side effects; subpackages are imported on demand:

- ``moestab.models``   the embedded tiny MoE policy and its character tokenizer
- ``moestab.routing``  recording routes (``RoutingRecorder``) and forcing them (``RoutingReplay``)
- ``moestab.rl``       log-probs, ratios, advantages, KL and the registered policy losses
- ``moestab.tasks``    verifiable-reward tasks
- ``moestab.train``    the GSPO/GRPO training loop behind ``moestab train``
- ``moestab.records``  the run-folder format (writer side)
- ``moestab.analysis`` analyzers over run folders
"""

__version__ = "0.1.0"
