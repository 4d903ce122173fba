"""The verl recipe: compare a batch's rollout routes with the actor's own, every step, in verl's metrics dict.

verl discussion #6805 asks for "a default-off R3 diagnostics hook for native-vs-replay route comparison". Under R3 the
batch's ``routed_experts`` are the rollout engine's routes, which the actor replays; the actor's native routes are
what its router would have chosen: record them with one R2-style RECORD forward (``router_replay.mode='R2'``'s
recording, or Megatron-Core's ``RouterReplayAction.RECORD``) and put them in the batch under another key
(``actor_routed_experts`` by default), in the same ``[batch, prompt_len + response_len, layers, top_k]`` layout. In
``RayPPOTrainer.fit``, after ``batch = batch.union(old_log_prob)``::

    from moestab.integrations.verl import route_metrics
    metrics.update(route_metrics(batch, num_experts=128, top_k=8))

With ``rollout_log_probs`` (``actor_rollout_ref.rollout.calculate_log_probs=True``) and ``old_log_probs`` in the batch
the dict also holds the log-prob mismatch (k3, F(2), verl's own ``rollout_probs_diff_*``). Pass a
:class:`~moestab.recording.diagnostics.DiagnosticsRun` and the step to append it to a moestab run folder too.
"""

from __future__ import annotations

import warnings
from typing import Any

from moestab.metrics import keys
from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics
from moestab.routes_in.common import PayloadError
from moestab.routes_in.verl import from_verl, has, tensors_of

LOG_PROB_REMEDIES = {
    "rollout_log_probs": "the rollout's come with actor_rollout_ref.rollout.calculate_log_probs=True",
    "old_log_probs": "the actor's are there after batch = batch.union(old_log_prob)",
}
"""The log-probs the mismatch metrics need, and how a verl run puts each in the batch."""


class MissingLogProbsWarning(UserWarning):
    """:func:`route_metrics` got a batch without log-probs: it returns routing keys only."""


def route_metrics(
    batch: Any,
    *,
    num_experts: int,
    top_k: int | None = None,
    rollout_key: str = "routed_experts",
    trainer_key: str = "actor_routed_experts",
    pair: str = "rollout_old_free",
    prefix: str = "moestab/",
    per_layer: bool = False,
    run: DiagnosticsRun | None = None,
    step: int | None = None,
    threads: int | None = 1,
) -> dict[str, float]:
    """moestab's rollout -> actor diagnostics of a verl ``DataProto`` (or mapping of its tensors), for verl's logger.

    Without ``rollout_log_probs`` or ``old_log_probs`` in the batch it returns routing keys only and warns
    (:class:`MissingLogProbsWarning`, once per calling line under Python's default warning filter).

    Args:
        batch: the step's batch, with ``rollout_key`` and ``trainer_key`` routes, ``responses``, ``attention_mask``
            (and ``response_mask``, ``rollout_log_probs``, ``old_log_probs`` when present).
        num_experts: routed experts per MoE layer; ``top_k`` reads verl's uint8 byte view of int16 ids.
        pair: ``rollout_old_free`` (default: the actor's native routes) or ``rollout_old`` (the routes its loss used).
        prefix: put before every key, to keep them apart in verl's metrics.
        per_layer: also return per-layer values as ``<key>/layer_<i>`` scalars (verl's logger takes scalars); the run
            folder gets them in full either way.
        run, step: append the step's metrics to this run folder (``step`` is verl's ``global_steps``).

    Returns:
        ``prefix + key`` -> value for moestab's keys and the frameworks' aliases (``keys.ALIASES``; verl's own are
        ``training/rollout_probs_diff_*``).
    """
    rollout = from_verl(batch, num_experts=num_experts, key=rollout_key, top_k=top_k)
    trainer = from_verl(batch, num_experts=num_experts, key=trainer_key, top_k=top_k)
    tensors = tensors_of(batch)
    logp = {}
    missing = [key for key in LOG_PROB_REMEDIES if not has(tensors, key)]
    if missing:
        # Once per calling line (Python's default filter): a verl run calls this every step.
        warnings.warn("route_metrics: the batch has no " + " or ".join(repr(key) for key in missing)
                      + ", so the metrics hold routing keys only (no k3, F(2) or rollout_probs_diff_*); "
                      + "; ".join(LOG_PROB_REMEDIES[key] for key in missing), MissingLogProbsWarning, stacklevel=2)
    else:
        logp = {"logp_rollout": rollout.per_token(tensors["rollout_log_probs"], "batch['rollout_log_probs']"),
                "logp_trainer": rollout.per_token(tensors["old_log_probs"], "batch['old_log_probs']")}
    if rollout.routes.indices.shape != trainer.routes.indices.shape:
        raise PayloadError(f"batch[{rollout_key!r}] and batch[{trainer_key!r}] differ in shape: "
                           f"{list(rollout.routes.indices.shape)} vs {list(trainer.routes.indices.shape)}")
    metrics = route_diagnostics(rollout.response_routes(), trainer.routes.indices[rollout.scoring], pair=pair,
                                threads=threads, **logp)
    if run is not None:
        if step is None:
            raise ValueError("pass step (verl's global_steps) with run")
        run.log(step, metrics)
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, list):
            if per_layer:
                out.update({f"{prefix}{key}/layer_{i:02d}": v for i, v in enumerate(value)})
            continue
        out[prefix + key] = value
    names = {alias.name: alias.pattern.format(pair=pair) for alias in keys.ALIASES}
    out.update({prefix + name: metrics[key] for name, key in names.items()
                if key in metrics and not isinstance(metrics[key], list)})
    return out
