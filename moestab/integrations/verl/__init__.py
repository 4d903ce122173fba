"""moestab in verl: :func:`route_metrics`, the rollout-vs-actor route diagnostics a verl trainer adds to its metrics
(verl discussion #6805's hook; docs/integrations.md, "verl"). Imports no verl: it reads the ``DataProto``'s tensors."""

from moestab.integrations.verl.recipe import MissingLogProbsWarning, route_metrics

__all__ = ["MissingLogProbsWarning", "route_metrics"]
