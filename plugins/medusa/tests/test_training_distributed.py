"""Medusa training in a two-process gloo world (as torchrun starts it): both ranks end with the
same heads, which training changed, and held-out counts cover every conversation once."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from specdec.training.conversations import Example
from specdec.training.distributed import World, join, leave
from specdec.training.examples import ExampleDataset
from specdec.training.loop import fit
from specdec_medusa.training.loop import FitOptions, MedusaTrainee, evaluate
from specdec_medusa.training.model import new_heads, trainable_state

VOCAB, HIDDEN = 13, 8


def _dataset() -> ExampleDataset:
    generator = torch.Generator().manual_seed(0)
    examples = []
    for n in range(8):
        length = 6 + n % 3
        mask = torch.zeros(length, dtype=torch.bool)
        mask[2:] = True
        examples.append(Example(f"c{n}", torch.randint(0, VOCAB, (length,), generator=generator), mask))
    return ExampleDataset(examples)


class Target:
    """A stand-in target: each token's state is a fixed random vector."""

    def __init__(self) -> None:
        self.table = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.table[batch["input_ids"]]


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update({"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    world = join(torch.device("cpu"))
    torch.manual_seed(rank)
    heads = new_heads(2, 1, torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)), share_lm_head=False)
    if rank == 1:
        with torch.no_grad():
            for p in trainable_state(heads).values():
                p.add_(1.0)  # rank 0's weights must win
    options = FitOptions(steps=4, batch_size=2, lr=1e-2, warmup=0)
    dataset = _dataset()
    fit(MedusaTrainee(heads, Target(), options), dataset, options, world)
    evaluation = evaluate(heads, Target(), dataset, options, world)
    torch.save(({n: p.detach().clone() for n, p in trainable_state(heads).items()}, evaluation), f"{out}/{rank}.pt")
    leave(world)


def test_two_processes_train_the_same_heads(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    (w0, e0), (w1, e1) = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    start = trainable_state(new_heads(2, 1, torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(2)), False))
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
    assert any(not torch.equal(w0[n], start[n]) for n in w0)
    assert e0 == e1
    # The two ranks' held-out measurement is one process's over the whole data.
    heads = new_heads(2, 1, torch.zeros(VOCAB, HIDDEN), share_lm_head=False)
    with torch.no_grad():
        for name, param in trainable_state(heads).items():
            param.copy_(w0[name])
    single = evaluate(heads, Target(), _dataset(), FitOptions(batch_size=2), World())
    assert single.accuracies == e0.accuracies and abs(single.acceptance_length - e0.acceptance_length) < 1e-9
    assert all(abs(a - b) < 1e-5 for a, b in zip(single.losses, e0.losses))
