"""One torchrun process for test_process_group_exit: a two-layer model sharded with FSDP2 over gloo, trained three
steps inside :func:`moestab.train.distributed.process_group`, then the process exits normally, or with status 3
when a module of the sharded model is still alive once the group is gone (left for interpreter finalization)."""

import gc
import sys
import warnings

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from moestab.train.distributed import process_group, world_from_env


def train() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    mesh = init_device_mesh("cpu", (world_from_env().size,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()  # [8, 64] -> scalar
        optimizer.step()
        optimizer.zero_grad()


def exit_if_sharded_alive() -> None:
    """Exit with status 3, naming them, when FSDP modules are still alive: after ``process_group`` nothing sharded
    may be left for interpreter finalization."""
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op proxy warns
        warnings.simplefilter("ignore", FutureWarning)
        alive = [type(o).__name__ for o in gc.get_objects() if isinstance(o, FSDPModule)]
    if alive:
        print(f"sharded modules still alive after process_group: {alive}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    with process_group(world_from_env(), torch.device("cpu")):
        train()
    exit_if_sharded_alive()
