"""What moestab guarantees for each MoE family, measured on a tiny model of it: one owner for the per-family tests
(tests/routing/test_all_families.py) and the table in docs/families.md (scripts/families_table.py).

For a family, ``family_report`` builds its tiny config in float64 (eager experts: grouped kernels take float32 /
bf16 only) and measures:

- ``replay_max_diff``: max |logit| difference between a free forward and the replay of its own recorded routes
  (``replay_bitwise`` when exactly 0);
- ``replay_other_diff``: the same against a replay of *other* routes (each expert id shifted by one): must be > 0;
- ``grad_max_diff`` / ``grad_norm``: the router parameters' gradient under replay of the same routes against the free
  forward's, and its norm (must be > 0: replay keeps the router trainable);
- ``generate_mismatch``: share of router decisions that differ between ``generate()`` with a KV cache and one full
  forward over the same tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from moestab.models.families import TINY_CONFIGS, tiny_config
from moestab.routing import RoutingRecorder, RoutingReplay, find_routers
from moestab.routing.routes import Routes

VOCAB = 128


@dataclass(frozen=True)
class FamilyReport:
    family: str
    router: str
    """Router class name."""
    selection: str
    gating: str
    moe_layers: tuple[int, ...]
    num_layers: int
    replay_max_diff: float
    replay_bitwise: bool
    replay_other_diff: float
    grad_max_diff: float
    grad_norm: float
    generate_mismatch: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64, **fields) -> PreTrainedModel:
    """A tiny model of ``family`` (2 MoE layers, 8 experts, top-2; config ``fields`` overridden), in eval mode."""
    if family not in TINY_CONFIGS:
        raise ValueError(f"unknown MoE family {family!r}; valid: {', '.join(sorted(TINY_CONFIGS))}")
    torch.manual_seed(seed)
    config = tiny_config(family, vocab_size=VOCAB, hidden_size=64, num_moe_layers=2, num_experts=8, top_k=2)
    for name, value in fields.items():
        setattr(config, name, value)
    # float64 needs the eager experts loop (grouped kernels take float32 / bf16 only).
    eager = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_config(config, **eager)
    return model.to(dtype).eval()


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three right-padded rows (right padding: every family's free forward is finite at real tokens with it)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, 9), generator=generator)  # [batch, seq]
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    mask[1, -1:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _router_grads(model: PreTrainedModel) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for s in find_routers(model, verify=False)
                      for p in s.module.parameters() if p.grad is not None])


def _loss(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [batch, seq, vocab]
    real = mask.bool()
    return logits, logits[real].log_softmax(-1)[:, 3].sum()


def _shifted(routes: Routes, num_experts: int) -> Routes:
    """The same routes with every expert id moved to the next one (still distinct within a token)."""
    indices = torch.where(routes.indices >= 0, (routes.indices + 1) % num_experts, routes.indices)
    return Routes(indices=indices, layers=routes.layers, num_experts=routes.num_experts)


def _generate_mismatch(model: PreTrainedModel, seed: int = 0) -> float:
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (2, 5), generator=generator)  # [batch, prompt], no padding
    with RoutingRecorder(model) as rec, torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                             min_new_tokens=6, do_sample=False, pad_token_id=0)
    with RoutingRecorder(model) as full, torch.no_grad():
        model(input_ids=out[:, :-1], attention_mask=torch.ones_like(out[:, :-1]), use_cache=False)
    generated = rec.routes.indices.sort(-1).values  # [batch, seq, layers, top_k]
    forward = full.routes.indices.sort(-1).values
    return float((generated != forward).any(-1).float().mean())


def family_report(family: str) -> FamilyReport:
    """Every per-family measurement on a fresh tiny model of ``family`` (see the module docstring)."""
    model = tiny_model(family)
    sites = find_routers(model)
    ids, mask = _batch()
    real = mask.bool()
    with RoutingRecorder(model) as rec:
        model.zero_grad()
        free_logits, loss = _loss(model, ids, mask)
        loss.backward()
    free_grad = _router_grads(model).clone()
    model.zero_grad()
    with RoutingReplay(model, rec.routes):
        replay_logits, loss = _loss(model, ids, mask)
        loss.backward()
    replay_grad = _router_grads(model)
    with RoutingReplay(model, _shifted(rec.routes, sites[0].num_experts)), torch.no_grad():
        other_logits, _ = _loss(model, ids, mask)
    selection, gating = sites[0].adapter.describe()
    free_logits, replay_logits = free_logits.detach(), replay_logits.detach()
    diff = (free_logits - replay_logits)[real].abs()
    return FamilyReport(
        family=family,
        router=type(sites[0].module).__name__,
        selection=selection,
        gating=gating,
        moe_layers=tuple(s.layer for s in sites),
        num_layers=int(model.config.num_hidden_layers),
        replay_max_diff=float(diff.max()),
        replay_bitwise=bool(torch.equal(free_logits[real], replay_logits[real])),
        replay_other_diff=float((free_logits - other_logits)[real].abs().max()),
        grad_max_diff=float((free_grad - replay_grad).abs().max()),
        grad_norm=float(replay_grad.norm()),
        generate_mismatch=_generate_mismatch(model),
    )
