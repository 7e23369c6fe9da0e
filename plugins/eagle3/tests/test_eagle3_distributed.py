"""Data parallelism: a single process needs no process group; two gloo processes (as torchrun
starts them) average gradients, start from rank 0's weights and agree on per-device choices."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from specdec.training.distributed import (
    World,
    average_gradients,
    broadcast_parameters,
    every_rank,
    join,
    leave,
    sum_across,
)


def test_single_process_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = join(torch.device("cpu"))
    assert world == World(0, 1, torch.device("cpu")) and world.is_main and not torch.distributed.is_initialized()
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.tensor([1.0, 3.0])
    average_gradients([param], world)
    assert param.grad.tolist() == [1.0, 3.0] and sum_across([2.0], world) == [2.0]


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update({"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    world = join(torch.device("cpu"))
    torch.manual_seed(rank)  # different initial weights on each rank
    layer = torch.nn.Linear(3, 2)
    broadcast_parameters(layer, world)
    layer(torch.full((1, 3), float(rank + 1))).sum().backward()
    average_gradients(list(layer.parameters()), world)
    votes = (every_rank(rank == 0, world), every_rank(True, world))
    torch.save((world.rank, world.size, layer.weight.detach().clone(), layer.weight.grad.clone(),
                     sum_across([1.0, float(rank)], world), votes), f"{out}/{rank}.pt")
    leave(world)


def test_two_processes_share_weights_and_average_gradients(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    (r0, n0, w0, g0, s0, v0), (r1, n1, w1, g1, s1, v1) = (torch.load(tmp_path / f"{r}.pt") for r in (0, 1))
    assert (r0, n0, r1, n1) == (0, 2, 1, 2)
    assert torch.equal(w0, w1)  # rank 1 took rank 0's weights
    # d(sum(W x))/dW = x per output row; inputs were 1s and 2s, so the mean gradient is 1.5 everywhere.
    assert torch.equal(g0, g1) and torch.allclose(g0, torch.full_like(g0, 1.5))
    assert s0 == s1 == [2.0, 1.0]
    # A choice only rank 0 would make (bf16 on its device) is made by neither; a shared one by both.
    assert v0 == v1 == (False, True)
