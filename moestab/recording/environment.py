"""What a run's numbers depend on besides its config: run.json's ``environment``, for ``moestab train`` and the TRL
integration alike.

fp32 CPU kernels pick their code path by instruction set (AVX2, AVX-512, AMX...), so the same seed at the same
versions gives other floats on another CPU, and RL amplifies them: a run's exact figures are its CPU's. The record
names the CPU so a reader knows which figures to expect bit for bit, and which only as mean +- sd over seeds.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers

CPUINFO = Path("/proc/cpuinfo")
PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``moestab`` package folder whose code is running: its git checkout, if any, is the code's provenance."""

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


def _git(args: list[str], where: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):  # no git, or it hung: the provenance is unknown, not an error
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code(package: Path | None = None) -> dict[str, Any]:
    """Which code is running: ``commit`` (the git commit of the checkout ``package`` lives in) and ``dirty`` (whether
    a tracked file of that checkout differs from the commit); both ``None`` when the package is not in a moestab
    checkout of its own (an installed wheel, or a checkout without git). A checkout counts only when ``package`` is its
    top-level ``moestab/`` folder, so a wheel installed in a virtual environment inside another project's repository
    does not report that project's commit."""
    package = (package or PACKAGE_DIR).resolve()
    top = _git(["rev-parse", "--show-toplevel"], package)
    if top is None or Path(top).resolve() / "moestab" != package:
        return {"commit": None, "dirty": None}
    commit = _git(["rev-parse", "HEAD"], package)
    status = _git(["status", "--porcelain", "--untracked-files=no"], package)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def environment(**extra: Any) -> dict[str, Any]:
    """run.json's ``environment``: torch's CPU threads, torch's and transformers' versions, the CPU, the code's commit
    (:func:`code`), then ``extra`` (the trainer's own: ``world_size``, ``trl``, ``measure_rule``...)."""
    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpu": cpu(), "code": code(), **extra}
