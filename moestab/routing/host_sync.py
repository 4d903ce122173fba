"""Host synchronisations inside hooks, found on any device: the CPU tests catch what would stall a GPU.

A hook that reads a tensor's value on the host (``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``) or runs an op
whose output shape depends on the data (``nonzero``, boolean-mask indexing, ``unique``) makes the host wait for the
GPU: the CPU can no longer queue kernels ahead of it. moestab's hooks run on every router of every forward, so one
such call costs a pipeline stall per layer.

:func:`find_host_syncs` runs a piece of code with every forward hook and forward pre-hook registered on a model (and
its submodules) at that moment under a detector, active only while those hooks run (the model's own forward is not
its business: transformers' expert loop calls ``nonzero``). The detector is a ``TorchFunctionMode`` that sees the
Python-level reads (:data:`HOST_READS`, and ``.to("cpu")``) and a ``TorchDispatchMode`` that sees the aten ops
(:data:`SYNC_OPS`, boolean-mask indexing, blocking copies between devices), each recorded with the line of code that
called it. On a CUDA model it also runs the hooks under ``torch.cuda.set_sync_debug_mode("error")``, so CUDA itself
names a synchronisation the two modes do not know.

On a CPU every tensor is on one device, so a copy between devices written ``.to(t.device)`` moves nothing and is not
seen there; ``.to`` counts as a copy to the host only when spelled with the string ``"cpu"``.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.hooks import RemovableHandle

HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
                        "__complex__", "__array__"})
"""Tensor methods that bring a value to the host (Python scalars, lists, numpy arrays, a CPU copy)."""

SYNC_OPS = frozenset({
    "aten._local_scalar_dense",  # .item(), bool(), int(), float() of a tensor
    "aten.nonzero", "aten.argwhere", "aten.masked_select",  # output shape = number of True values
    "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.unique_dim_consecutive",
    "aten.bincount", "aten.histc",  # size their output from the data's range
    "aten.equal",  # returns a Python bool
})
"""aten ops that wait for the device on CUDA whatever their arguments."""

_MASK_INDEXED = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
_TORCH_DIR = str(Path(torch.__file__).parent)
_CUDA_SYNC_ERROR = "called a synchronizing CUDA operation"


@dataclass(frozen=True)
class HostSync:
    """One host synchronisation seen inside a hook."""

    op: str
    """What synchronised: a tensor method (``Tensor.item``), an aten op (``aten.nonzero``), or ``cuda`` (CUDA's own
    report under ``set_sync_debug_mode``)."""
    where: str
    """``path:line: source`` of the code that called it (the innermost frame outside torch)."""


def find_host_syncs(model: nn.Module, run: Callable[[], object]) -> list[HostSync]:
    """Call ``run()`` (forwards, ``generate()``, a backward...) with every forward hook and forward pre-hook now
    registered on ``model`` or its submodules under the detector; the host synchronisations they made, in order.

    Enter the contexts whose hooks are to be checked (``RoutingRecorder``, ``RoutingReplay``) before calling this. On
    CUDA the first synchronisation CUDA reports aborts ``run()``; it is returned as the last entry, op ``cuda``.
    """
    found: list[HostSync] = []
    detector = _Detector(found, cuda=any(p.is_cuda for p in model.parameters()))
    handles = _bracket(model, detector)
    try:
        run()
    except RuntimeError as exc:
        if _CUDA_SYNC_ERROR not in str(exc):
            raise
        found.append(HostSync("cuda", _where(traceback.extract_tb(exc.__traceback__))))
    finally:
        for handle in handles:
            handle.remove()
        detector.close()
    return found


def describe(syncs: list[HostSync]) -> str:
    """One line per place that synchronised, its ops named (``"none"`` when there are none)."""
    places: dict[str, list[str]] = {}
    for sync in syncs:
        ops = places.setdefault(sync.where, [])
        if sync.op not in ops:
            ops.append(sync.op)
    return "; ".join(f"{', '.join(ops)} at {where}" for where, ops in places.items()) or "none"


class _Detector:
    """Enters the two modes (and CUDA's sync check) when a bracketed hook group starts, leaves them when it ends."""

    def __init__(self, found: list[HostSync], *, cuda: bool) -> None:
        self.found = found
        self.cuda = cuda
        self._open: list[tuple[TorchFunctionMode, TorchDispatchMode, int | None]] = []

    def on(self, *hook_args: Any) -> None:
        calls, ops = _CallFinder(self.found), _OpFinder(self.found)
        calls.__enter__()
        ops.__enter__()
        previous = None
        if self.cuda:
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
        self._open.append((calls, ops, previous))

    def off(self, *hook_args: Any) -> None:
        if not self._open:
            return
        calls, ops, previous = self._open.pop()
        if previous is not None:
            torch.cuda.set_sync_debug_mode(previous)
        ops.__exit__(None, None, None)
        calls.__exit__(None, None, None)

    def close(self) -> None:
        """Leave whatever a hook that raised left open."""
        while self._open:
            self.off()


def _bracket(model: nn.Module, detector: _Detector) -> list[RemovableHandle]:
    """Put ``detector.on`` before and ``detector.off`` after the forward pre-hooks and the forward hooks of every
    module that has some, so the detector is active while they run and only then."""
    handles = []
    for module in model.modules():
        # torch keeps a module's hooks in these ordered dicts; prepend=True puts a hook first.
        if module._forward_pre_hooks:
            handles.append(module.register_forward_pre_hook(detector.on, prepend=True))
            handles.append(module.register_forward_pre_hook(detector.off))
        if module._forward_hooks:
            handles.append(module.register_forward_hook(detector.on, prepend=True))
            handles.append(module.register_forward_hook(detector.off))
    return handles


class _Finder:
    """A mode that appends what it finds to ``found``."""

    def __init__(self, found: list[HostSync]) -> None:
        super().__init__()
        self.found = found


class _CallFinder(_Finder, TorchFunctionMode):
    """Records the tensor methods that read a value on the host."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_READS or (name == "to" and _names_cpu(args[1:], kwargs)):
            self.found.append(HostSync(f"Tensor.{name}", _caller()))
        return func(*args, **kwargs)


class _OpFinder(_Finder, TorchDispatchMode):
    """Records the aten ops that wait for the device on CUDA."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _syncing_op(func, args, kwargs)
        if op is not None:
            self.found.append(HostSync(op, _caller()))
        return func(*args, **kwargs)


def _syncing_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The name under which ``func(*args, **kwargs)`` synchronises on CUDA, or None when it does not."""
    name = str(func.overloadpacket)  # e.g. "aten.nonzero"
    if name in SYNC_OPS:
        return name
    if name in _MASK_INDEXED and any(_is_mask(i) for i in (args[1] if len(args) > 1 else ())):
        return f"{name} (boolean mask)"
    if name == "aten.repeat_interleave" and func._overloadname != "self_int" and kwargs.get("output_size") is None:
        return f"{name} (tensor repeats, no output_size)"
    if name == "aten._to_copy" and kwargs.get("device") is not None and not kwargs.get("non_blocking", False):
        source, target = args[0].device, torch.device(kwargs["device"])
        return f"{name} ({source} -> {target}, blocking)" if _moves(source, target) else None
    if name == "aten.copy_" and not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)):
        target, source = args[0].device, args[1].device
        return f"{name} ({source} -> {target}, blocking)" if _moves(source, target) else None
    return None


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _moves(source: torch.device, target: torch.device) -> bool:
    """A copy between these devices involves the host and a device (the meta device moves nothing)."""
    return source != target and "meta" not in (source.type, target.type) and "cpu" in (source.type, target.type)


def _names_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``.to(...)``'s arguments name the host with the string "cpu" (a ``torch.device`` cannot be told from the
    tensor's own device on a CPU)."""
    targets = [*args, kwargs.get("device")]
    return any(isinstance(t, str) and t.split(":")[0] == "cpu" for t in targets)


def _caller() -> str:
    """The innermost frame outside torch and this module, as ``path:line: source``."""
    frame = sys._getframe(1)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    return "?" if frame is None else _line(frame.f_code.co_filename, frame.f_lineno)


def _where(frames: traceback.StackSummary) -> str:
    """The innermost frame of a traceback outside torch and this module, as ``path:line: source``."""
    outside = [f for f in frames if not _internal(f.filename)]
    return _line(outside[-1].filename, outside[-1].lineno or 0) if outside else "?"


def _internal(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename == __file__


def _line(filename: str, lineno: int) -> str:
    relative = os.path.relpath(filename)
    path = filename if relative.startswith("..") else relative
    return f"{path}:{lineno}: {linecache.getline(filename, lineno).strip()}"

