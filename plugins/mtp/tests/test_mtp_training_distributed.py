"""MTP training in a two-process gloo world (as torchrun starts it): both ranks end with the same
layers, which training changed, and their held-out measurement is one process's over all the data."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp

from specdec.testing import make_tiny_target
from specdec.training.conversations import Example
from specdec.training.distributed import World, join, leave
from specdec.training.examples import ExampleDataset
from specdec.training.loop import fit
from specdec_mtp.training.loop import FitOptions, MTPTarget, MTPTrainee, evaluate
from specdec_mtp.training.model import new_layers, trainable_state


def _dataset(vocab: int) -> ExampleDataset:
    generator = torch.Generator().manual_seed(0)
    examples = []
    for n in range(8):
        length = 8 + n % 3
        mask = torch.zeros(length, dtype=torch.bool)
        mask[3:] = True
        examples.append(Example(f"c{n}", torch.randint(3, vocab, (length,), generator=generator), mask))
    return ExampleDataset(examples)


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update({"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    world = join(torch.device("cpu"))
    target = make_tiny_target(seed=0)
    layers = new_layers(target.model, 2)
    if rank == 1:
        with torch.no_grad():
            for p in trainable_state(layers).values():
                p.add_(1.0)  # rank 0's weights must win
    options = FitOptions(steps=4, batch_size=2, lr=1e-2, warmup=0)
    dataset = _dataset(target.model.config.vocab_size)
    frozen = MTPTarget(target.model)
    fit(MTPTrainee(layers, frozen, options), dataset, options, world)
    evaluation = evaluate(layers, frozen, dataset, options, world)
    torch.save(({n: p.detach().clone() for n, p in trainable_state(layers).items()}, evaluation), f"{out}/{rank}.pt")
    leave(world)


def test_two_processes_train_the_same_layers(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    (w0, e0), (w1, e1) = (torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in (0, 1))
    target = make_tiny_target(seed=0)
    layers = new_layers(target.model, 2)
    start = {n: p.detach().clone() for n, p in trainable_state(layers).items()}
    assert all(torch.equal(w0[n], w1[n]) for n in w0)
    assert any(not torch.equal(w0[n], start[n]) for n in w0)
    assert e0 == e1
    with torch.no_grad():
        for name, param in trainable_state(layers).items():
            param.copy_(w0[name])
    single = evaluate(layers, MTPTarget(target.model), _dataset(target.model.config.vocab_size), FitOptions(batch_size=2),
                      World())
    assert single.accuracies == e0.accuracies
    assert all(abs(a - b) < 1e-5 for a, b in zip(single.losses, e0.losses))
