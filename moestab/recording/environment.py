"""What a run's numbers depend on besides its config: run.json's ``environment``, for ``moestab train`` and the TRL
integration alike.

fp32 CPU kernels pick their code path by instruction set (AVX2, AVX-512, AMX...), so the same seed at the same
versions gives other floats on another CPU, and RL amplifies them: a run's exact figures are its CPU's. The record
names the CPU so a reader knows which figures to expect bit for bit, and which only as mean +- sd over seeds.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch
import transformers

CPUINFO = Path("/proc/cpuinfo")

VECTOR_FLAG_PREFIXES = ("avx", "amx", "fma", "asimd", "sve")
"""The /proc/cpuinfo flags kept: the vector and matrix extensions fp32 and bf16 kernels dispatch on (x86, Arm)."""


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The first processor's model name and vector flags in a /proc/cpuinfo text; ``None`` / ``[]`` where absent."""
    model, flags = None, []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep:
            continue
        if model is None and name in ("model name", "Model Name", "cpu model"):
            model = value.strip() or None
        elif not flags and name in ("flags", "Features"):  # x86 / Arm
            flags = sorted({f for f in value.split() if f.startswith(VECTOR_FLAG_PREFIXES)})
    return {"model": model, "flags": flags}


def cpu() -> dict[str, Any]:
    """This machine's CPU: ``model`` and ``flags`` from /proc/cpuinfo (``None`` / ``[]`` where it is absent or
    unreadable), ``machine`` (``platform.machine()``) and ``capability``, the instruction set torch's CPU kernels
    dispatch to (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``, ``AVX512``, ``DEFAULT``...)."""
    try:
        found = parse_cpuinfo(CPUINFO.read_text(errors="replace"))
    except OSError:
        found = parse_cpuinfo("")
    return {**found, "machine": platform.machine() or None, "capability": torch.backends.cpu.get_cpu_capability()}


def environment(**extra: Any) -> dict[str, Any]:
    """run.json's ``environment``: torch's CPU threads, torch's and transformers' versions, the CPU, then ``extra``
    (the trainer's own: ``world_size``, ``trl``, ``measure_rule``...)."""
    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpu": cpu(), **extra}
