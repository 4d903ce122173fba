"""One TRL generation cycle as a moestab step: the captured forwards laid out as ``StepTensors``.

Rows are put in generation order (TRL's generation batch: ``num_generations`` consecutive rows per prompt). TRL
shuffles the batch before splitting it into micro-batches, so each micro-batch row is matched back to the
generated sequence whose tokens it holds (identical sequences are interchangeable: same prompt, same tokens).
The layout is moestab's (``moestab.recording.batch``): input = prompt + completion[:-1], ``L = P + C - 1``; the routes
of a response token are those of the position that predicts it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from moestab.integrations.trl.capture import GenerationCall, ScoringCall
from moestab.integrations.trl.settings import ClipRule, CycleLayout
from moestab.recording.batch import RolloutBatch
from moestab.recording.measurements import Measurement, sampled_columns
from moestab.recording.step_tensors import StepTensors
from moestab.routing import RecordingError, Routes
from moestab.tasks import Example


@dataclass(frozen=True)
class LossStep:
    """One ``training_step`` of the cycle: TRL's micro-batch and the loss forward on it."""

    inputs: dict[str, Any]
    """TRL's micro-batch: ``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``, ``advantages``
    and, when TRL computed pi_old, ``old_per_token_logps``."""
    call: ScoringCall


@dataclass
class CycleRecord:
    """What one recorded generation cycle captured, in order."""

    generation: GenerationCall
    old_calls: list[ScoringCall]
    """The no-grad scoring forwards after generating: TRL's pi_old forward (none when TRL computes none: pi_old is
    then the loss forward), followed with PEFT by its reference forward."""
    steps: list[LossStep]
    started: float
    """``time.perf_counter()`` when its first micro-step began."""


def rollout_ids(gen: GenerationCall) -> torch.Tensor:
    """``[N, P + C - 1]``: the generated sequences as the policy was fed them (the last token never is)."""
    return torch.cat([gen.prompt_ids, gen.fed.to(gen.prompt_ids.device)], dim=1)


def _keys(ids: torch.Tensor) -> list[bytes]:
    rows = ids.detach().to("cpu", torch.int64).contiguous().numpy()  # [n, L]
    return [row.tobytes() for row in rows]


class RowMatcher:
    """Rows of ``pool`` ``[N, L]`` matched to the rows of parts given one at a time, by their tokens: each pool row is
    used once, identical rows are assigned in order."""

    def __init__(self, pool: torch.Tensor) -> None:
        self._free: dict[bytes, deque[int]] = defaultdict(deque)
        for index, key in enumerate(_keys(pool)):
            self._free[key].append(index)

    def match(self, part: torch.Tensor) -> torch.Tensor:
        """``[b]`` the pool rows of ``part``'s rows ``[b, L]``; ``RecordingError`` when a row has no match left (the
        parts are not a re-ordering of ``pool``'s rows)."""
        rows = []
        for key in _keys(part):
            if not self._free[key]:
                raise RecordingError("a trained sequence matches no generated one: TRL's micro-batches are not a "
                                     "re-ordering of its last generation batch")
            rows.append(self._free[key].popleft())
        return torch.tensor(rows, dtype=torch.long)


def _inverse(rows: Sequence[torch.Tensor], n: int) -> torch.Tensor:
    """``[n]``: where each pool row sits in ``cat(rows)``; raises unless ``cat(rows)`` is a permutation of ``n``."""
    order = torch.cat(list(rows))  # [n]
    if order.numel() != n or not torch.equal(order.sort().values, torch.arange(n)):
        raise RecordingError(f"the recorded forwards cover {order.numel()} rows, not each of the {n} generated once")
    inverse = torch.empty(n, dtype=torch.long)
    inverse[order] = torch.arange(n)
    return inverse


def gather_rows(parts: Sequence[torch.Tensor], rows: Sequence[torch.Tensor], n: int) -> torch.Tensor:
    """Per-row tensors of several parts ``[b_i, ...]`` put in pool order ``[n, ...]``."""
    return torch.cat([p.detach().cpu() for p in parts])[_inverse(rows, n)]


def scatter_rows(parts: Sequence[torch.Tensor], rows: Sequence[torch.Tensor], n: int, fill: float) -> torch.Tensor:
    """Like :func:`gather_rows` for parts that cover only some pool rows: the others hold ``fill``."""
    values = torch.cat([p.detach().cpu() for p in parts])  # [covered, ...]
    out = values.new_full((n, *values.shape[1:]), fill)  # [n, ...]
    out[torch.cat(list(rows))] = values
    return out


def _positions(routes: Routes, length: int) -> Routes:
    """The first ``length`` input positions of ``routes``."""

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:, :length]

    return replace(routes, indices=routes.indices[:, :length], margin=cut(routes.margin), entropy=cut(routes.entropy),
                   confidence=cut(routes.confidence), router_logprobs=cut(routes.router_logprobs),
                   slot_scores=cut(routes.slot_scores), gates=cut(routes.gates))


def gather_routes(parts: Sequence[Routes], rows: Sequence[torch.Tensor], n: int, length: int) -> Routes:
    """Routes of several forwards over the same positions, first ``length`` positions, in pool order."""
    cat = Routes.cat([_positions(p.to("cpu"), length) for p in parts])  # [n, length, layers, k]
    return replace(cat.select(_inverse(rows, n)), rows=None)


def scatter_routes(parts: Sequence[Routes], rows: Sequence[torch.Tensor], n: int, length: int) -> Routes:
    """Like :func:`gather_routes` for parts that cover only some pool rows: the others are not recorded (-1);
    router statistics are not kept."""
    cat = Routes.cat([_positions(p.to("cpu"), length) for p in parts])  # [covered, length, layers, k]
    indices = scatter_rows([cat.indices], rows, n, -1)  # [n, length, layers, k]
    return Routes(indices=indices, layers=cat.layers, num_experts=cat.num_experts)


def _entropy(call: ScoringCall, prompt_len: int) -> torch.Tensor:
    """``[b, C]`` entropy of the distribution of each completion token."""
    if call.entropy is None:
        raise RecordingError("TRL's scoring forward returned no entropy")
    return call.entropy[:, prompt_len - 1 :].float()  # [b, C]


def last_pass(steps: Sequence[LossStep], layout: CycleLayout) -> list[tuple[int, LossStep]]:
    """``(micro-step index, step)`` of the last pass over the generation batch (``num_iterations`` > 1 trains on
    each micro-batch several times; moestab keeps a sequence's last update, the one furthest from pi_old)."""
    if len(steps) != layout.micro_steps:
        raise RecordingError(f"the cycle ran {len(steps)} micro-steps, expected {layout.micro_steps}")
    start = layout.micro_steps - layout.micro_per_pass
    return list(enumerate(steps))[start:]


@dataclass(frozen=True)
class _Policy:
    """One policy's forwards over the generation batch, in generation order."""

    logp: torch.Tensor  # [N, C] log-prob of each completion token
    routes: Routes  # [N, L, layers, k], with router statistics when they were recorded
    entropy: torch.Tensor  # [N, C]


def scored_policy(calls: Sequence[ScoringCall], rows: Sequence[torch.Tensor], n: int, prompt_len: int, *,
                  partial: bool = False) -> _Policy:
    """``calls`` (chunks of the batch; ``rows``: each chunk's generation rows) as one batch in generation order.
    ``partial``: the chunks cover only some rows; the others get NaN log-probs and entropies and no routes (-1)."""
    length = calls[0].input_ids.shape[1] - 1  # TRL feeds the last completion token too: it predicts nothing
    logp = [c.log_probs[:, prompt_len - 1 :].float() for c in calls]  # TRL's log_probs[:, -C:]
    entropy = [_entropy(c, prompt_len) for c in calls]
    if partial:
        return _Policy(logp=scatter_rows(logp, rows, n, float("nan")),
                       routes=scatter_routes([c.routes for c in calls], rows, n, length),
                       entropy=scatter_rows(entropy, rows, n, float("nan")))
    return _Policy(logp=gather_rows(logp, rows, n), routes=gather_routes([c.routes for c in calls], rows, n, length),
                   entropy=gather_rows(entropy, rows, n))


def trained_ids(step: LossStep, pool: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """``[b, L]`` the sequences a micro-batch trained on, as ``pool`` ``[N, L]`` holds the generated ones."""
    length = pool.shape[1]
    completion_len = length - prompt_len + 1
    shape = (step.inputs["prompt_ids"].shape[1], step.inputs["completion_ids"].shape[1])
    if shape != (prompt_len, completion_len):
        raise RecordingError(f"TRL trained on prompts x completions of {shape}, but generated {prompt_len} x "
                             f"{completion_len}: moestab cannot align the rollout's routes")
    return torch.cat([step.inputs["prompt_ids"], step.inputs["completion_ids"]], 1)[:, :length].cpu()


def _rollout_logp(gen: GenerationCall, completion: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, C]``: each completion token's log-prob under the generation step that sampled it (0 off ``mask``)."""
    last = gen.last_logp.cpu().gather(-1, completion[:, -1:].to(torch.long))  # [N, 1] the never-fed last token
    return torch.cat([gen.fed_logp.cpu(), last], dim=1).masked_fill(~mask, 0.0)  # [N, C]


def old_rows(cycle: CycleRecord, layout: CycleLayout, trained: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Generation rows of each of :func:`pi_old_calls`: TRL's pi_old forward scores the batch in generation order;
    without it pi_old's calls are the last pass's loss forwards, whose rows are ``trained``."""
    if not layout.old_forward:
        return list(trained)
    return in_order([c.input_ids.shape[0] for c in pi_old_calls(cycle, layout)])


def measured_rows(cycle: CycleRecord, layout: CycleLayout, rows: Sequence[torch.Tensor],
                  picked: Sequence[int]) -> torch.Tensor | None:
    """``[N]`` bool: the rows of pi_old's calls number ``picked`` (``rows``: each call's), or None when every call
    is picked."""
    if len(picked) == len(rows):
        return None
    measured = torch.zeros(cycle.generation.prompt_ids.shape[0], dtype=torch.bool)  # [N]
    measured[torch.cat([rows[i] for i in picked])] = True
    return measured


def assemble(
    cycle: CycleRecord,
    rows: Sequence[torch.Tensor],
    measures: Sequence[Measurement],
    measured: torch.Tensor | None,
    *,
    layout: CycleLayout,
    clip: ClipRule,
    group_size: int,
    decode: Callable[[torch.Tensor], list[str]],
) -> StepTensors:
    """The cycle's ``StepTensors``, with what the step's measurements (:mod:`moestab.recording.measurements`) filled,
    run by the trainer on the ``measured`` rows ``[N]`` (None: every row; the others have no pi_new: routes -1,
    log-probs NaN, and ``StepTensors.measured`` says so). ``rows``: the generation rows of each micro-batch of the
    last pass, as the trainer matched them (:class:`RowMatcher` over :func:`trained_ids`, in order)."""
    gen = cycle.generation
    pool = rollout_ids(gen).cpu()  # [N, L]
    n, prompt_len = gen.prompt_ids.shape
    final = last_pass(cycle.steps, layout)
    if len(rows) != len(final):
        raise RecordingError(f"{len(rows)} micro-batches matched for a last pass of {len(final)}")

    def batch_col(name: str) -> torch.Tensor:  # a column of TRL's micro-batches, in generation order
        return gather_rows([step.inputs[name] for _, step in final], rows, n)

    completion = batch_col("completion_ids")  # [N, C]
    prompt_mask, completion_mask = batch_col("prompt_mask"), batch_col("completion_mask")  # [N, P], [N, C]
    response_mask = completion_mask.bool()  # [N, C]
    advantages = batch_col("advantages").float()  # [N]
    if advantages.dim() != 1:
        raise RecordingError(f"advantages of shape {tuple(advantages.shape)}: moestab records one per sequence")
    optimizer_step = [torch.full((len(r),), i // layout.grad_accum) for (i, _), r in zip(final, rows, strict=True)]
    update = scored_policy([step.call for _, step in final], rows, n, prompt_len)

    old_calls = pi_old_calls(cycle, layout)
    old = scored_policy(old_calls, old_rows(cycle, layout, rows), n, prompt_len)
    if layout.old_forward:
        if not torch.equal(torch.cat([c.input_ids[:, : pool.shape[1]].cpu() for c in old_calls]), pool):
            raise RecordingError("TRL's pi_old forward did not score the generated sequences in generation order")
        if not torch.equal(batch_col("old_per_token_logps").float(), old.logp):  # what TRL's ratio used
            raise RecordingError("TRL's old_per_token_logps differ from its pi_old forward's log-probs")
    # else TRL's ratio is exactly 1 (old_per_token_logps is the loss forward's own, detached): old == update.
    clipped = clip.mask(update.logp, old.logp, advantages, response_mask)  # [N, C]

    batch = RolloutBatch(
        input_ids=pool,
        attention_mask=torch.cat([prompt_mask, completion_mask], dim=1)[:, : pool.shape[1]],  # [N, L]
        targets=completion,
        response_mask=response_mask,
        logp_rollout=_rollout_logp(gen, completion, response_mask),
        routes=replace(gen.routes.to("cpu"), rows=None),  # [N, L, layers, k]
        prompt_len=prompt_len,
        completions=decode(completion),  # TRL pads after the first EOS; decode drops special tokens
    )
    return StepTensors.of(dict(
        batch=batch,
        examples=_examples(pool[:, :prompt_len], group_size, decode),
        rewards=None,  # not in TRL's micro-batches (only the advantages are): no reward/* key, NaN in the tables
        correct=None,  # unknown: no task scores TRL's completions
        advantages=advantages,
        minibatch=gather_rows(optimizer_step, rows, n),  # [N]
        logp_old=old.logp,
        logp_old_free=old.logp,  # TRL replays no routes: pi_old as used is the free one
        logp_update=update.logp,
        clipped=clipped,
        routes_old=old.routes.indices,
        routes_old_free=old.routes,
        routes_update=update.routes.indices,
        entropy=old.entropy,  # [N, C]
        **{k: v for m in measures for k, v in m.filled().items()},  # pi_new; with routing_share, the replayed side
        measured=measured,
        sampled=sampled_columns(measures, measured),
    ))


def pi_old_routes(cycle: CycleRecord, layout: CycleLayout, rows: torch.Tensor, positions: int) -> Routes:
    """``[b, L, layers, k]`` the routes of TRL's pi_old forward for generation ``rows`` ``[b]`` (its calls score the
    batch in generation order; :func:`assemble` checks it), on the forward's device: what ``RoutingReplay`` forces
    to score a micro-batch of ``positions`` input positions with pi_old's routes. Indexing by the rows the trainer
    matched keeps each of two identical sequences its own routes. Only when TRL computed pi_old
    (``layout.old_forward``)."""
    if not layout.old_forward:
        raise RecordingError("TRL computed no pi_old forward: pi_old's routes are the loss forward's own")
    calls = pi_old_calls(cycle, layout)
    indices = torch.cat([c.routes.indices for c in calls])  # [N, L, layers, k]
    if indices.shape[1] != positions:
        raise RecordingError(f"TRL's pi_old forward fed {indices.shape[1]} positions, its loss forward "
                             f"{positions}: pi_old's routes cannot be replayed on it")
    first = calls[0].routes
    return Routes(indices=indices[rows.to(indices.device)], layers=first.layers, num_experts=first.num_experts)


def pi_old_calls(cycle: CycleRecord, layout: CycleLayout) -> list[ScoringCall]:
    """The forwards that computed pi_old: TRL's no-grad pi_old forward (its first no-grad scoring calls, one row
    per generated sequence; a PEFT reference forward may follow) or, when TRL has none, the last pass's loss
    forwards (pi_old's weights are still the trained ones then). pi_new replays exactly these inputs."""
    if not layout.old_forward:
        return [step.call for _, step in last_pass(cycle.steps, layout)]
    n = cycle.generation.prompt_ids.shape[0]
    taken, rows = [], 0
    for call in cycle.old_calls:
        if rows == n:
            break
        taken.append(call)
        rows += call.input_ids.shape[0]
    if rows != n:
        raise RecordingError(f"TRL's pi_old forward scored {rows} rows, expected the {n} generated")
    return taken


def in_order(sizes: Sequence[int]) -> list[torch.Tensor]:
    """Rows of consecutive chunks of ``sizes`` rows: ``[0..b0), [b0..b0+b1), ...``."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [torch.arange(s, s + b) for s, b in zip(starts, sizes, strict=True)]


def _examples(prompts: torch.Tensor, group_size: int, decode: Callable[[torch.Tensor], list[str]]) -> list[Example]:
    """One ``Example`` per prompt group ``[N, P]`` -> ``N / G``; the reference answer is TRL's reward functions'
    business, so it is left empty (it is never written)."""
    n = prompts.shape[0]
    if n % group_size:
        raise RecordingError(f"{n} generated sequences are not groups of num_generations={group_size}")
    groups = prompts.view(n // group_size, group_size, -1)  # [groups, G, P]
    if not torch.equal(groups, groups[:, :1].expand_as(groups)):
        raise RecordingError(f"the generation batch is not {group_size} consecutive rows per prompt")
    return [Example(prompt=text, answer="") for text in decode(groups[:, 0])]
