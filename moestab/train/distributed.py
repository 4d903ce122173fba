"""Data-parallel training over N processes: the policy sharded with FSDP2, each rank rolling out its own groups.

``moestab train --nproc N`` (or ``torchrun --nproc-per-node N -m moestab train ...``) runs the same loop in N
processes (gloo on CPU, NCCL on GPU). What is split and what is exact:

- **Prompts** of a step are split in N equal contiguous blocks (``prompts_per_step % N == 0``): a group never
  spans two ranks, so advantages stay per group and need no communication.
- **Minibatches** are drawn over the *global* batch exactly as in one process; rank r trains on the rows of each
  minibatch it holds (possibly none). Every rank runs every forward, so FSDP's collectives line up.
- **Losses**: rank r's minibatch loss is scaled by ``N * w_r / W`` (``w`` = the aggregation's weight: response
  tokens for token-mean, non-empty rows for the seq-mean modes; ``W`` its sum over ranks). FSDP averages
  gradients over ranks, so the update is the gradient of the one-process loss of the whole minibatch.
- **Metrics and records** are computed on rank 0 from every rank's tensors, merged into the global batch
  (:func:`moestab.recording.step_tensors.cat_step_tensors`), by the same functions as in one process.
"""

from __future__ import annotations

import copy
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, PreTrainedModel

from moestab.models.precision import float64_norms

TIMEOUT = timedelta(minutes=30)
"""How long a collective waits for a silent rank (a rank that dies outright is noticed at once)."""


class RankFailureError(RuntimeError):
    """A collective failed: another rank died or stopped answering."""


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 owns the run folder, the logs and the progress bar."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def block(self, n: int) -> slice:
        """The contiguous share of ``n`` items (``n % size == 0``) this rank holds."""
        share = n // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    # ---- collectives (no-ops in one process) ----------------------------------------------------------------------
    def sum(self, value: float) -> float:
        """``value`` summed over ranks, in float64."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        _collective(dist.all_reduce, t)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (e.g. a Ctrl-C that reached one process first)."""
        return self.sum(float(flag)) > 0

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order (``None`` elsewhere)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.size if self.is_main else None
        _collective(dist.gather_object, obj, out, dst=0)
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank, in rank order."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        _collective(dist.all_gather_object, out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        _collective(dist.broadcast_object_list, box, src=0)
        return box[0]


SINGLE = World()


def _collective(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except (RuntimeError, dist.DistBackendError) as exc:  # gloo/NCCL: a peer closed its connection or timed out
        raise RankFailureError(f"rank {dist.get_rank()}: a {fn.__name__} with the other ranks failed; another rank "
                               f"probably stopped (its error, or torchrun's report of it, is printed above): "
                               f"{exc}") from exc


def world_from_env() -> World:
    """The world torchrun describes in the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one process if
    unset."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(rank=int(os.environ.get("RANK", "0")), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """The default process group for ``world``, destroyed on exit; nothing in one process. On CUDA each process
    takes GPU ``local_rank`` and the group runs NCCL for GPU tensors and gloo for the CPU ones (the small
    reductions and object exchanges of :class:`World` run on the CPU); on a CPU, gloo."""
    if not world.distributed or dist.is_initialized():
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group: NCCL and FSDP use the current device
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    try:
        yield
    finally:
        # The sharded model, its meshes and hooks form reference cycles that hold gloo work objects; left to
        # interpreter finalization, freeing them can abort a finished process ("terminate called without an active
        # exception": 3 of 36 `moestab train --nproc 2` runs, torch 2.13, FSDP2 on gloo). Collected here, they go
        # while the group and the interpreter are up (tests/train/test_process_group_exit.py).
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_policy(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """Shard ``model`` with FSDP2 across every process, its shards on ``device``'s type: each decoder layer (the
    classes the model declares unsplittable) is one unit, the rest (embeddings, final norm, LM head) the root's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # default: the accelerator even for --device cpu
    units = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in units:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer at full size on this rank: gathered from the shards (a collective: every rank
    calls it) or, unsharded, the model's own state dict."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def unsharded_copy(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A plain (unsharded) copy of ``model`` in ``dtype``, in eval mode: the rollout engine's own weights."""
    if not is_sharded(model):
        return copy.deepcopy(model).to(dtype).eval()
    weights = full_state_dict(model)
    device = next(iter(weights.values())).device
    replica = AutoModelForCausalLM.from_config(model.config, dtype=dtype).to(device)
    if dtype == torch.float64:
        float64_norms(replica)  # as load_policy does (a deep copy keeps the policy's hooks)
    replica.load_state_dict(weights)
    replica.generation_config = model.generation_config
    return replica.eval()


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state to save: its own ``state_dict()`` in one process; sharded, the full state keyed by
    parameter name (a collective), loadable by any number of ranks.

    Before the first step there is no state to gather, and asking torch for it would create some: its full-state
    API initialises an empty optimizer by stepping it with zero gradients, which moves AdamW's step count and so
    changes the first real update. The empty state is saved as it is."""
    if not is_sharded(model) or not optimizer.state:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                               cpu_offload=True))


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Restore what :func:`optimizer_state` saved."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    if not state["state"]:  # saved before the first step: nothing to restore (see optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))


def local_chunks(chunks: list[torch.Tensor], world: World, batch_size: int) -> list[torch.Tensor]:
    """Global minibatch rows (over ``batch_size`` sequences) -> this rank's rows of each, as local indices
    (possibly empty)."""
    block = world.block(batch_size)
    return [rows[(rows >= block.start) & (rows < block.stop)] - block.start for rows in chunks]


def rank_seed(seed: int, rank: int) -> int:
    """The sampling seed of ``rank`` in a step seeded ``seed`` (rank 0 keeps ``seed``: one process is rank 0)."""
    return seed if rank == 0 else (seed * 1_000_033 + rank * 104_729) % (2**31 - 1)
