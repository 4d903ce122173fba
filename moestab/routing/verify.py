"""Checking an adapter against the router it adapts, on the model itself, before it is trusted.

A transformers release can change a family's routing math without renaming anything. Before recording or replaying,
every router is called once on a few synthetic tokens (eval mode, no grad, its own generator: no global RNG is
touched) and the adapter must reproduce what the router did: its gating applied to the router's own logits and
own experts gives the router's own gates, and its selection scores rank the router's own experts first. Any
difference is refused with the family, the router and the size of the difference.

Limits: hooks on the router's own submodules (e.g. a LoRA wrapper on its linear layer) see the probe tokens; ties in
the selection scores pass the ranking check (and Llama-4's reader takes its experts from the logits' top-k, so the
check cannot fail there); gates are compared to 4 ulps of their dtype, so a bf16 ordering slip
in a gating recipe shows only in an exact replay test (tests/routing/test_all_families.py has one per family).
"""

from __future__ import annotations

import torch
from torch import nn

from moestab.routing.adapters import RouterAdapter
from moestab.routing.errors import AdapterMismatchError, DamagedWeightsError

PROBE_TOKENS = 32
"""Synthetic tokens each router is checked on."""


def _hidden_size(router: nn.Module, num_experts: int) -> tuple[int, torch.dtype, torch.device]:
    """The router's input width, dtype and device, read from its ``[experts, hidden]`` weight."""
    for param in router.parameters():
        if param.dim() == 2 and param.shape[0] == num_experts:
            return int(param.shape[1]), param.dtype, param.device
    raise AdapterMismatchError(
        f"{type(router).__name__} has no [experts={num_experts}, hidden] weight; moestab cannot probe it"
    )


class Probes:
    """The synthetic tokens routers are checked on, drawn once per width for all routers of a model.

    Every router gets the same draw (a generator seeded 0: ``randn(PROBE_TOKENS, hidden)``, then ``rand(experts)`` for a
    bias argument), so ``find_routers`` draws it once and hands each router a copy: drawing 32 x hidden normals
    with a fresh generator took about a fifth of each router's check.
    """

    def __init__(self) -> None:
        self._drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # hidden -> (tokens, generator state after)

    def draw(self, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[PROBE_TOKENS, hidden]`` float32 tokens, and the state of their generator after drawing them."""
        if hidden not in self._drawn:
            generator = torch.Generator().manual_seed(0)
            tokens = torch.randn(PROBE_TOKENS, hidden, generator=generator)  # [N, hidden]
            self._drawn[hidden] = (tokens, generator.get_state())
        return self._drawn[hidden]


def _forward_inputs(
    adapter: RouterAdapter, router: nn.Module, num_experts: int, probes: Probes
) -> tuple[torch.Tensor, ...]:
    hidden, dtype, device = _hidden_size(router, num_experts)
    tokens, state = probes.draw(hidden)
    tokens = tokens.to(device=device, dtype=dtype, copy=True)  # [N, hidden], the router's own copy
    tokens = tokens.view(*[1] * (adapter.router_input_dims - 2), PROBE_TOKENS, hidden)
    # Routers whose MoE block passes in a correction bias take it as a forward argument: give them one, so the
    # adapter's use of it is checked too.
    position = getattr(adapter.selection_scores, "bias", None)
    if not isinstance(position, int):
        return (tokens,)
    generator = torch.Generator().set_state(state)  # as it stood after drawing the tokens
    bias = torch.rand(num_experts, generator=generator).to(device=device, dtype=torch.float32) * 0.1
    return (tokens, *[None] * (position - 1), bias)


def check_finite_router(router: nn.Module, name: str) -> None:
    """Raise :class:`DamagedWeightsError` naming the first of ``router``'s weights with NaN or infinity in it: the
    gates would be NaN, which is the checkpoint's fault, not a routing-math change to blame on transformers."""
    for what, tensor in [*router.named_parameters(), *router.named_buffers()]:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise DamagedWeightsError(f"router {name}: {what} holds {bad:,} NaN or infinite values of "
                                      f"{tensor.numel():,}; the model's weights are damaged")


def verify_router(adapter: RouterAdapter, router: nn.Module, name: str, probes: Probes | None = None) -> None:
    """Raise ``AdapterMismatchError`` unless ``adapter`` reproduces ``router``'s own gates and choice.

    ``probes``: the synthetic inputs, shared by the routers of one model (default: drawn for this router alone).
    """
    check_finite_router(router, name)
    num_experts, top_k = adapter.num_experts(router), adapter.top_k(router)
    inputs = _forward_inputs(adapter, router, num_experts, probes or Probes())
    modes = [(module, module.training) for module in router.modules()]  # restored one by one afterwards
    training = any(mode for _, mode in modes)
    if training:
        router.eval()  # training-mode jitter / sampling would consume the global RNG
    try:
        with torch.no_grad():
            # .forward, not __call__: hooks of an active recorder or replay must not see the probe.
            logits, gates, indices = adapter.read(router.forward(*inputs), top_k)  # [N, E], [N, k], [N, k]
            mine = adapter.gates(router, logits, indices).to(gates.dtype)  # [N, k]
            scores = adapter.selection_scores(router, logits, inputs).float()  # [N, E]
    finally:
        if training:  # a router already in eval mode (inference) needs no switching back
            for module, mode in modes:
                module.training = mode
    family = f"{adapter.family} router {name} ({type(router).__name__})"
    if logits.shape[-1] != num_experts:
        raise AdapterMismatchError(f"{family} scores {logits.shape[-1]} experts, its adapter expects {num_experts}")
    tolerance = 4 * torch.finfo(gates.dtype).eps
    diff = float((mine.float() - gates.float()).abs().max())
    if not diff <= tolerance * max(1.0, float(gates.float().abs().max())):
        raise AdapterMismatchError(
            f"{family}: moestab's gating ({adapter.describe()[1]}) differs from the router's own gates by {diff:.3g} "
            f"for the router's own experts; this transformers version changed the family's routing math, and "
            f"replay would not be exact. Please report it with your transformers version."
        )
    kth = scores.topk(top_k, dim=-1).values[:, -1:]  # [N, 1]
    chosen = scores.gather(-1, indices.long())  # [N, k]
    if bool((chosen < kth).any()):
        raise AdapterMismatchError(
            f"{family}: moestab's selection scores ({adapter.describe()[0]}) do not rank the router's own experts "
            f"first; this transformers version changed how the family picks experts. Please report it."
        )
