"""One trainer forward of the policy over a rollout batch, with optional replay and recording."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from moestab import rl
from moestab.recording.batch import RolloutBatch, position_ids_from_mask
from moestab.routing import Routes, RoutingRecorder, RoutingReplay


@dataclass(frozen=True)
class PolicyForward:
    logp: torch.Tensor
    """``[B, T]`` log-probs of the response tokens (with grad when the forward had grad)."""
    entropy: torch.Tensor | None
    """``[B, T]`` token entropy (detached), when asked."""
    routes: Routes | None
    """Routes used at every input position ``[B, L, layers, top_k]``, when recorded."""
    aux_loss: torch.Tensor | None = None
    """0-dim load-balancing loss the model computes from its router logits, when asked (with grad)."""


def policy_forward(
    model: PreTrainedModel,
    batch: RolloutBatch,
    *,
    temperature: float,
    replay: Routes | None = None,
    force_gates: bool = False,
    score_ratio: float = 0.0,
    record: bool = True,
    router_logprobs: bool = False,
    entropy: bool = False,
    router_stats: bool = False,
    aux_loss: bool = False,
) -> PolicyForward:
    """Log-probs of ``batch``'s responses under ``model``; routes forced to ``replay`` when given, and with
    ``force_gates`` their recorded gate weights too (``RoutingReplay(force_gates=True)``: router frozen), and with
    ``score_ratio`` > 0 filtered by the router's own scores (score-threshold replay, ``moestab.routing.threshold``).

    ``aux_loss`` also returns the model's own load-balancing loss (transformers' ``output_router_logits``);
    a family without one (DeepSeek-V3 balances with a bias instead) raises ``ValueError``.

    ``entropy`` also returns the policy's token entropy; ``router_stats`` records the routers'
    margins and entropies with the routes (only pi_old's are kept in the run records).

    With both ``replay`` and ``record``, the recorded routes are the replayed ones (what was used). The routers are
    not re-checked against their adapters here (this runs several times per step): ``moestab train`` and the rollout
    engine check the model once, with ``find_routers(model)``.
    """
    with ExitStack() as stack:
        if replay is not None:
            stack.enter_context(RoutingReplay(model, replay, force_gates=force_gates, verify=False,
                                              score_ratio=score_ratio))
        recorder = (
            stack.enter_context(
                RoutingRecorder(model, margin=router_stats, entropy=router_stats, router_logprobs=router_logprobs,
                                verify=False)
            )
            if record
            else None
        )
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=position_ids_from_mask(batch.attention_mask),
            use_cache=False,
            **({"output_router_logits": True} if aux_loss else {}),
        )
        logits = out.logits  # [B, L, V]
    balance = getattr(out, "aux_loss", None) if aux_loss else None
    if aux_loss and balance is None:
        raise ValueError(f"{model.config.model_type} computes no load-balancing loss (router_aux_loss_coef needs one)")
    response_logits = batch.response_logits(logits)  # [B, T, V]
    logp = rl.token_logprobs(response_logits, batch.targets, temperature=temperature)  # [B, T]
    ent = None
    if entropy:
        with torch.no_grad():
            ent = rl.token_entropy(response_logits.detach(), temperature=temperature)  # [B, T]
    return PolicyForward(logp=logp, entropy=ent, routes=recorder.routes if recorder else None, aux_loss=balance)


def response_routes(routes: Routes, batch: RolloutBatch) -> torch.Tensor:
    """``[B, T, layers, top_k]``: the routes at the input positions whose logits score each response token."""
    return routes.indices[:, batch.prompt_len - 1 :]


def _chunk_forwards(
    model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], *, replay: Routes | None, **kwargs,
) -> Iterator[tuple[torch.Tensor, PolicyForward]]:
    """``(rows, policy_forward of them)`` per non-empty chunk of ``chunks`` (``kwargs``: its options)."""
    for rows in chunks:
        # A process holding none of a minibatch still runs its forward, on a stand-in row whose output is dropped:
        # a sharded policy's forward is a collective (moestab.train.distributed).
        held = rows if len(rows) else rows.new_zeros(1)
        fwd = policy_forward(model, batch.select(held), replay=None if replay is None else replay.select(held),
                             **kwargs)
        if len(rows):
            yield rows, fwd


def chunk_logprobs(
    model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], *, temperature: float,
    replay: Routes | None = None, force_gates: bool = False,
) -> torch.Tensor:
    """``[B, T]`` log-probs of the rows of ``chunks``, some of the minibatches, each forwarded as in
    :func:`chunked_policy_forward` (no recording); NaN on the rows of the other minibatches."""
    logp = torch.full(batch.response_mask.shape, float("nan"), device=batch.response_mask.device,
                      dtype=next(model.parameters()).dtype)  # [B, T]
    for rows, fwd in _chunk_forwards(model, batch, chunks, temperature=temperature, replay=replay,
                                     force_gates=force_gates, record=False):
        logp[rows] = fwd.logp.to(logp.dtype)
    return logp


def chunked_policy_forward(
    model: PreTrainedModel,
    batch: RolloutBatch,
    chunks: list[torch.Tensor],
    *,
    temperature: float,
    replay: Routes | None = None,
    force_gates: bool = False,
    record: bool = True,
    router_logprobs: bool = False,
    entropy: bool = False,
    router_stats: bool = False,
) -> PolicyForward:
    """``policy_forward`` over row ``chunks`` (the minibatches), reassembled in batch order.

    Running pi_old in the same chunks as the updates gives the first update bit-identical inputs,
    so its ratios are exactly 1 rather than 1 up to batch-shape-dependent rounding.
    """
    parts = list(_chunk_forwards(model, batch, chunks, temperature=temperature, replay=replay,
                                 force_gates=force_gates, record=record, router_logprobs=router_logprobs,
                                 entropy=entropy, router_stats=router_stats))
    order = torch.cat([rows for rows, _ in parts])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))

    def gather(get):
        values = [get(p) for _, p in parts]
        return None if values[0] is None else torch.cat(values)[inverse]

    routes = None
    if record:
        routes = Routes.cat([p.routes for _, p in parts]).select(inverse)
        routes = replace(routes, rows=None)
    return PolicyForward(logp=gather(lambda p: p.logp), entropy=gather(lambda p: p.entropy), routes=routes)


def measured_forward(
    model: PreTrainedModel, batch: RolloutBatch, chunks: list[torch.Tensor], measured: torch.Tensor, **kwargs,
) -> PolicyForward:
    """:func:`chunked_policy_forward` (``kwargs``: its options) of the ``measured`` rows ``[B]`` bool only, in the
    ``chunks`` restricted to them, laid out over the whole batch: the other rows hold NaN log-probs, entropies and
    router statistics and -1 routes (not recorded). No row measured: no forward runs."""
    rows = torch.nonzero(measured).flatten()  # [m]
    record = kwargs.get("record", True)
    if len(rows):
        position = torch.full((batch.batch_size,), -1, dtype=torch.long)  # [B] row -> row of the sample
        position[rows] = torch.arange(len(rows))
        sub_chunks = [position[c[measured[c]]] for c in chunks if bool(measured[c].any())]
        part = chunked_policy_forward(model, batch.select(rows), sub_chunks, **kwargs)
    else:
        part = None

    def spread(values: torch.Tensor | None) -> torch.Tensor:  # [m, T] of the sample -> [B, T], NaN elsewhere
        out = torch.full(batch.response_mask.shape, float("nan"), device=batch.input_ids.device,
                         dtype=torch.float32 if values is None else values.dtype)
        if values is not None:
            out[rows.to(out.device)] = values
        return out

    logp = spread(None if part is None else part.logp)  # [B, T]
    entropy = None
    if kwargs.get("entropy"):
        entropy = spread(None if part is None else part.entropy)  # [B, T]
    routes = None
    if record:
        like = batch.routes  # [B, L, layers, k]: every trainer forward routes the same layers
        indices = torch.full_like(like.indices, -1)  # [B, L, layers, k]
        stats: dict[str, torch.Tensor | None] = {"margin": None, "entropy": None, "confidence": None,
                                                 "router_logprobs": None, "slot_scores": None, "gates": None}
        if part is not None:
            got = part.routes
            indices[rows.to(indices.device)] = got.indices.to(indices.device)
            for name in stats:
                value = getattr(got, name)
                if value is not None:
                    full = torch.full((batch.batch_size, *value.shape[1:]), float("nan"), dtype=value.dtype,
                                      device=value.device)
                    full[rows.to(value.device)] = value
                    stats[name] = full
            layers, num_experts = got.layers, got.num_experts
        else:
            layers, num_experts = like.layers, like.num_experts
        routes = Routes(indices=indices, layers=layers, num_experts=num_experts, **stats)
    return PolicyForward(logp=logp, entropy=entropy, routes=routes)
