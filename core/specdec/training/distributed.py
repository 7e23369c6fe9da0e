"""Data parallelism with torch.distributed, for launches by ``torchrun`` or ``accelerate launch``.

Both launchers start one process per device and set ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. With ``WORLD_SIZE`` above 1 each process joins a process
group (NCCL on CUDA, gloo on CPU), reads its own share of the batches (``LengthGroupedBatches``,
or ``DistributedSampler`` without length grouping), averages gradients with the others after
every backward (all-reduce) and starts from rank 0's weights; only rank 0 shows progress and
writes checkpoints. A plain ``specdec`` run is one process and never touches a process group.
Shared by the training commands of every method plugin (EAGLE-3, Medusa).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def join(device: torch.device) -> World:
    """This process's place in a launcher's world (a single process without a launcher)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(0, 1, device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), device)


def leave(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(module: torch.nn.Module, world: World) -> None:
    """Every rank starts from rank 0's weights and buffers."""
    if world.distributed:
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def average_gradients(parameters: list[torch.nn.Parameter], world: World) -> None:
    """All-reduce the gradients so every rank takes the same optimizer step."""
    if world.distributed:
        for param in parameters:
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad.div_(world.size)


def every_rank(flag: bool, world: World) -> bool:
    """Whether ``flag`` holds on every rank: a choice each process makes from its own device (such
    as ``--precision auto``) becomes one choice for the whole world."""
    if not world.distributed:
        return flag
    tensor = torch.tensor([int(flag)], device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def sum_across(values: list[float], world: World) -> list[float]:
    """Element-wise sum of ``values`` over every rank (counts for logging)."""
    if not world.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()
