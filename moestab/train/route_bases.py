"""The frozen models a run routes by or measures against, beside the policy: :class:`RouteBases`.

- ``--routing-replay base``: every forward of the policy uses the experts a frozen model chooses for the same tokens
  (:class:`~moestab.routing.base_routing.BaseRouting`). That model is the warm-started base (routing-constant), or,
  with ``--base-refresh-every K``, a copy of the policy that takes the policy's weights at the start of steps 1,
  K + 1, 2K + 1, ...: routing held within each window of K steps, free to move between windows (issue 52's
  dose-response, from K = 1, pi_old's routes in every forward of a step, to K = infinity, routing-constant).
- ``--measure-base-routes``: how far the rollout's routes are from the warm-started base's on the same tokens
  (``routing/base_rollout/*``), one more no-grad forward of the base per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from moestab.metrics import keys
from moestab.metrics.routes import intersection_sizes, route_change
from moestab.recording.step_tensors import StepTensors
from moestab.run_folder import RunFolder, schema
from moestab.train.config import TrainConfig
from moestab.train.forward import policy_forward
from moestab.train.run_lifetime import TrainingError


@dataclass
class RouteBases:
    """The run's frozen models (each ``None`` when its setting is off); both are never trained."""

    route: PreTrainedModel | None
    """The model whose experts every forward of the policy uses (``--routing-replay base``)."""
    distance: PreTrainedModel | None
    """The warm-started base the rollout's routes are compared with (``--measure-base-routes``)."""
    refresh_every: int = 0
    """``--base-refresh-every``: 0, :attr:`route` is the warm-started base, never refreshed."""

    def refreshes_at(self, step: int) -> bool:
        """Whether :attr:`route` takes the policy's weights at the start of ``step`` (steps 1, K + 1, 2K + 1, ...)."""
        return self.refresh_every > 0 and (step - 1) % self.refresh_every == 0

    def saves_at(self, step: int) -> bool:
        """Whether ``step``'s weights are a refresh's (the copy of steps ``step + 1`` to ``step + K``): its
        checkpoint is saved, so that ``--resume`` restores the copy from it (and deleted once no kept training state
        needs it: :func:`moestab.train.checkpoint.superseded_checkpoints`)."""
        return self.refresh_every > 0 and step % self.refresh_every == 0

    @torch.no_grad()
    def refresh(self, policy: PreTrainedModel) -> None:
        """:attr:`route` takes ``policy``'s weights (in place: the engine's and the context's handles stay valid)."""
        assert self.route is not None
        self.route.load_state_dict(policy.state_dict())


def refresh_source(start_step: int, refresh_every: int) -> int:
    """The step whose checkpoint holds the copy's weights when a run starts after ``start_step``: the last refresh,
    ``K * floor(start_step / K)`` (0: the base)."""
    return refresh_every * (start_step // refresh_every)


def build_route_bases(
    config: TrainConfig, folder: RunFolder, start_step: int, base_path: str, ref_model: PreTrainedModel | None,
    load: Callable[[str], PreTrainedModel],
) -> RouteBases:
    """The frozen models ``config`` asks for. ``load(path)`` loads a policy folder (``base_path``, the warm-started
    base, or a checkpoint of the run); the reference model, itself the frozen base, is shared where it can be."""

    def frozen(path: str) -> PreTrainedModel:
        return load(path).eval().requires_grad_(False)

    warm_base = ref_model  # the reference policy is the same frozen base
    route = None
    if config.routing_replay in schema.BASE_ROUTED_MODES:
        if config.base_refresh_every:
            source = refresh_source(start_step, config.base_refresh_every)
            path = folder.checkpoint_dir(source) if source else None
            if path is not None and not path.is_dir():
                raise TrainingError(f"--resume: the copy --base-refresh-every {config.base_refresh_every} routes by "
                                    f"took step {source}'s weights, and that checkpoint ({path}) is missing")
            route = frozen(str(path) if path is not None else base_path)  # a copy of its own: it is refreshed
        else:
            route = warm_base if warm_base is not None else frozen(base_path)
            warm_base = route
    distance = None
    if config.measure_base_routes:
        distance = warm_base if warm_base is not None else frozen(base_path)
    return RouteBases(route, distance, config.base_refresh_every)


@torch.no_grad()
def base_route_distance(base: PreTrainedModel, tensors: StepTensors, *, temperature: float,
                        chunk: int) -> dict[str, object]:
    """``routing/base_rollout/*``: the slot-level change between the routes ``base`` chooses for the step's tokens
    (free routing, ``chunk`` sequences a forward) and the rollout's routes, over every response token and per MoE
    layer; ``moestab.metrics.routes.route_change``'s ``changed``, as every routing pair."""
    batch = tensors.batch
    parts = [policy_forward(base, batch.select(rows), temperature=temperature).routes.indices
             for rows in torch.arange(batch.batch_size).split(chunk)]  # each [b, L, layers, k]
    chosen = torch.cat(parts)  # [B, L, layers, k] the base's routes
    rollout = tensors.response(batch.routes.indices).cpu().numpy()  # [tokens, layers, k]
    theirs = tensors.response(chosen.to(batch.routes.indices.device)).cpu().numpy()  # [tokens, layers, k]
    rates = route_change(intersection_sizes(rollout, theirs, threads=1), rollout.shape[-1])
    return {keys.ROUTING_BASE_CHANGED: float(rates["changed"][0]),
            keys.ROUTING_BASE_CHANGED_BY_LAYER: rates["changed_by_layer"][0].tolist()}
