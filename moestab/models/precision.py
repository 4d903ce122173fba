"""Float64 norms in a float64 model.

Transformers' RMSNorms compute in float32 (``hidden_states.to(torch.float32)``, then back to the input dtype): an
upcast for 16-bit weights, a downcast in a float64 model. A float64 run then rounds every norm's input to float32, and
its backward runs in float32 too, with the cancellation of ``x * rsqrt(mean(x**2))``'s gradient. Two float64 runs whose
values differ by summation order (processes, thread counts, a CPU's BLAS kernels) then differ by whole float32 roundings
wherever a value crosses one, and training carries those on: a float64 difference of 300-1000 ulps moved a 2-step loss
by 1.4e-8-3.2e-8 relative with float32 norms and by at most 2e-12 with float64 ones (issue 40.7). The router's float32
softmax stays as it is: it is the family's routing math, which replay reproduces (``moestab.routing.gating``).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle


class _KeepFloat64(TorchFunctionMode):
    """Inside a norm: a float64 tensor asked to become float32 (``.to(torch.float32)``, ``.float()``) stays float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            if func is torch.Tensor.float:
                return args[0]
            if func is torch.Tensor.to:
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _is_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm")  # every MoE family's norm class (moestab.models.families)


def float64_norms(model: torch.nn.Module) -> list[RemovableHandle]:
    """Make every RMSNorm of ``model`` compute in float64 when its input is float64 (and change nothing for any other
    dtype), by a pair of forward hooks per norm; their handles (``handle.remove()`` restores the family's math).

    The forward hook is registered ``always_call``: a norm that raises still leaves the float64 casts behind."""
    handles = []
    for module in model.modules():
        if _is_norm(module):
            active: list[_KeepFloat64] = []  # this norm's mode while its forward runs

            def enter(_module, _args, active=active) -> None:
                active.append(_KeepFloat64())
                active[-1].__enter__()

            def leave(_module, _args, _output, active=active) -> None:
                if active:
                    active.pop().__exit__(None, None, None)

            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave, always_call=True))
    return handles
