"""The routing math of MoE families as data: how a router ranks experts and how it weights the chosen ones.

Most transformers MoE routers are one of a few recipes with different attribute names (softmax over all experts
and an optional renormalisation; softmax over the chosen logits; sigmoid scores with a correction bias, optional
group-limited selection, renormalisation and a scaling factor). ``Selection`` and ``Gating`` write a recipe down
as data so that each family's adapter is one line, and ``moestab.routing.verify`` checks the recipe against the
router's own output on the model itself. The few routers that fit no recipe get a small function of their own.

Everything here is pure: explicit tensors in, tensors out. Gate math runs in the dtype the family uses (float32 for
most, the logits' own dtype for a few); callers cast gates to the dtype the router hands its experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

Probs = Literal["softmax", "softmax_topk", "sigmoid", "sigmoid_topk"]


def _work(logits: torch.Tensor, dtype: str = "float32") -> torch.Tensor:
    """``logits`` in the dtype the family does its math in: ``float32``, or ``logits`` (their own dtype)."""
    return logits.float() if dtype == "float32" else logits


def _attr(router: nn.Module, path: str) -> Any:
    """A router attribute by dotted path, e.g. ``moe_statics.e_score_correction_bias``."""
    value: Any = router
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _flag(router: nn.Module, setting: bool | str) -> bool:
    return bool(_attr(router, setting)) if isinstance(setting, str) else setting


def _number(router: nn.Module, setting: float | str) -> float:
    return float(_attr(router, setting)) if isinstance(setting, str) else setting


@dataclass(frozen=True)
class Gating:
    """``(router, logits [N, E], indices [N, k]) -> gates [N, k]``: the combine weights of the chosen experts.

    ``probs``: ``softmax`` over all experts then gathered; ``softmax_topk`` over the chosen experts' logits only;
    ``sigmoid`` per expert (``sigmoid_topk``: of the chosen logits only, the same values in the other order).
    Then, when ``renorm`` holds (a bool, or the name of the router attribute that says), the chosen weights are
    divided by their sum (+ ``eps``; at least ``min_denominator`` when that names a router attribute), and finally
    multiplied by ``scale`` (a number or a router attribute name). ``dtype``: the family computes in ``float32``
    whatever the model's dtype, or in the ``logits``' own dtype.
    """

    probs: Probs
    renorm: bool | str = False
    eps: float = 0.0
    min_denominator: str | None = None
    scale: float | str = 1.0
    dtype: Literal["float32", "logits"] = "float32"

    def __call__(self, router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        work = _work(logits, self.dtype)  # [N, E]
        if self.probs == "softmax":
            top = torch.softmax(work, dim=-1).gather(-1, indices)  # [N, k]
        elif self.probs == "softmax_topk":
            top = torch.softmax(work.gather(-1, indices), dim=-1)  # [N, k]
        elif self.probs == "sigmoid":
            top = work.sigmoid().gather(-1, indices)  # [N, k]
        elif self.probs == "sigmoid_topk":
            # Same values as "sigmoid", but vectorised sigmoid kernels round the last bit differently on an [N, k]
            # tensor than on [N, E]: follow the family's order to stay bitwise.
            top = work.gather(-1, indices).sigmoid()  # [N, k]
        else:
            raise ValueError(f"unknown probs {self.probs!r}; valid: softmax, softmax_topk, sigmoid, sigmoid_topk")
        if _flag(router, self.renorm):
            denominator = top.sum(dim=-1, keepdim=True) + self.eps  # [N, 1]
            if self.min_denominator is not None:
                denominator = denominator.clamp(min=_number(router, self.min_denominator))
            top = top / denominator
        scale = _number(router, self.scale)
        return top * scale if scale != 1.0 else top

    def describe(self) -> str:
        words = {"softmax": "softmax over all experts", "softmax_topk": "softmax over the top-k logits",
                 "sigmoid": "sigmoid", "sigmoid_topk": "sigmoid"}[self.probs]
        if self.renorm is True:
            words += ", renormalised"
        elif isinstance(self.renorm, str):
            words += f", renormalised if {self.renorm}"
        if self.scale != 1.0:
            words += f", x {self.scale}"
        return words


@dataclass(frozen=True)
class Selection:
    """``(router, logits [N, E], inputs) -> scores [N, E]``: what the router ranks to pick its top-k.

    ``base``: ``logits`` (softmax families: softmax is monotone), ``softmax`` or ``sigmoid`` of the logits. ``bias``:
    a correction bias added before ranking, read from a router attribute (dotted path) or, as an int, from that
    positional argument of the router's forward (some families keep the bias on the MoE block and pass it in).
    ``groups``: group-limited selection (DeepSeek-V3): experts split into ``router.num_group`` groups, a group scores
    the sum of its top-2, and only the best ``router.topk_group`` groups stay eligible (-inf elsewhere).
    """

    base: Literal["logits", "softmax", "sigmoid"] = "logits"
    bias: str | int | None = None
    groups: bool = False
    bias_if: str | None = None
    """Router attribute that switches the bias on (LFM2-MoE's ``use_expert_bias``); None: always on."""
    dtype: Literal["float32", "logits"] = "float32"
    """Dtype the family ranks in (the bias added with torch's type promotion, as the family does)."""

    def __call__(self, router: nn.Module, logits: torch.Tensor, inputs: tuple[Any, ...] = ()) -> torch.Tensor:
        work = _work(logits, self.dtype)  # [N, E]
        if self.base == "softmax":
            work = torch.softmax(work, dim=-1)
        elif self.base == "sigmoid":
            work = work.sigmoid()
        bias = self.bias_of(router, inputs)
        if bias is not None:
            work = work + bias.reshape(-1)  # [N, E]
        if self.groups:
            work = group_limited(work, int(router.num_group), int(router.topk_group))
        return work

    def bias_of(self, router: nn.Module, inputs: tuple[Any, ...]) -> torch.Tensor | None:
        if self.bias is None or (self.bias_if is not None and not _flag(router, self.bias_if)):
            return None
        if isinstance(self.bias, str):
            return _attr(router, self.bias)
        return inputs[self.bias] if len(inputs) > self.bias else None

    def describe(self) -> str:
        words = {"logits": "logits", "softmax": "softmax", "sigmoid": "sigmoid"}[self.base]
        if self.bias is not None:
            words += " + bias"
        if self.groups:
            words += ", group-limited"
        return words


def group_limited(scores: torch.Tensor, num_group: int, topk_group: int) -> torch.Tensor:
    """``scores [N, E]`` with -inf outside each token's ``topk_group`` best groups (a group scores its top-2 sum)."""
    n_tokens, n_experts = scores.shape
    grouped = scores.view(n_tokens, num_group, n_experts // num_group)  # [N, G, E/G]
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, G]
    group_idx = group_scores.topk(topk_group, dim=-1, sorted=False).indices  # [N, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)  # [N, G]
    keep = keep.unsqueeze(-1).expand_as(grouped).reshape(n_tokens, n_experts)  # [N, E]
    return scores.masked_fill(~keep, float("-inf"))


# ---- routers that fit no recipe -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChoiceGating:
    """A gating picked by a router attribute's value (Cohere2-MoE's ``expert_selection_fn``)."""

    attribute: str
    choices: tuple[tuple[str, Gating], ...]

    def _pick(self, router: nn.Module) -> Gating:
        value = _attr(router, self.attribute)
        for name, gating in self.choices:
            if value == name:
                return gating
        valid = ", ".join(name for name, _ in self.choices)
        raise ValueError(f"{type(router).__name__}.{self.attribute} = {value!r} is not one moestab knows ({valid})")

    def __call__(self, router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self._pick(router)(router, logits, indices)

    def describe(self) -> str:
        return f"by {self.attribute}: " + "; ".join(f"{n}: {g.describe()}" for n, g in self.choices)


@dataclass(frozen=True)
class SparseMixerGating:
    """PhiMoE's SparseMixer in eval mode, top-k by successive masking: for each slot, experts whose logit falls more
    than ``2 * router_jitter_noise`` (relative) below the best remaining logit are masked out, the rest are
    softmaxed, and the slot's expert is gathered; the expert is then removed for the next slot."""

    def __call__(self, router: nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        work = logits  # [N, E], in its own dtype as the family computes
        eps = float(router.router_jitter_noise)
        remaining = work
        gates = []
        for slot in range(indices.shape[-1]):
            chosen = indices[:, slot : slot + 1]  # [N, 1]
            best = remaining.max(dim=-1, keepdim=True).values  # [N, 1]
            far = ((best - work) / work.abs().clamp(min=best)) > 2 * eps  # [N, E]
            gates.append(torch.softmax(remaining.masked_fill(far, float("-inf")), dim=-1).gather(-1, chosen))
            remaining = remaining.scatter(-1, chosen, float("-inf"))
        return torch.cat(gates, dim=-1)  # [N, k]

    def describe(self) -> str:
        return "SparseMixer (masked softmax per slot)"


@dataclass(frozen=True)
class DeepseekV2Selection:
    """DeepSeek-V2: softmax scores; with ``topk_method == 'group_limited_greedy'`` only the ``topk_group`` groups
    with the highest single score stay eligible (the others are zeroed, as the family does)."""

    def __call__(self, router: nn.Module, logits: torch.Tensor, inputs: tuple[Any, ...] = ()) -> torch.Tensor:
        scores = torch.softmax(_work(logits), dim=-1)  # [N, E]
        if router.topk_method != "group_limited_greedy":
            return scores
        n_tokens, n_experts = scores.shape
        grouped = scores.view(n_tokens, router.num_group, n_experts // router.num_group)  # [N, G, E/G]
        group_idx = grouped.max(dim=-1).values.topk(router.topk_group, dim=-1, sorted=False).indices  # [N, tg]
        keep = torch.zeros(grouped.shape[:2], dtype=torch.bool, device=scores.device).scatter_(1, group_idx, True)
        return scores.masked_fill(~keep.unsqueeze(-1).expand_as(grouped).reshape(n_tokens, n_experts), 0.0)

    def describe(self) -> str:
        return "softmax, group-limited (max) if topk_method says"
