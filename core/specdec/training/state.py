"""A trainer's resumable state: where training stands, and the file that holds it.

The drafter trainers (Medusa heads, MTP layers) save the trainable parameters, the optimizer and
schedule, the options and the position in one file, written atomically, and a resumed run restores
exactly that: with the data and seed unchanged it takes the very steps an uninterrupted run takes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.errors import ConfigError
from specdec.training.distributed import World, sum_across

#: The training state's file in a trainer's ``--output`` directory.
STATE_FILE = "training_state.pt"


@dataclass
class TrainingOptions:
    """A drafter trainer's options that every trainer has (each adds its own and its defaults)."""

    steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 20
    #: Output ``k``'s loss weight is ``decay ** k`` (``k`` from 0: head or depth).
    decay: float = 1.0
    weight_decay: float = 0.0
    #: AdamW's betas (torch's defaults).
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    #: Positions per output whose logits are computed at once (memory: ``chunk x vocab`` floats).
    chunk: int = 1024
    #: Matrix products in bfloat16 (autocast); weights, optimizer and losses stay float32.
    bf16: bool = False
    #: Train the softmax over the this many most frequent reply tokens (0: the whole vocabulary).
    train_vocab: int = 0
    #: Sort each group of 50 steps by length (little padding) rather than batching at random.
    group_by_length: bool = True
    seed: int = 0
    #: Save (export and training state) every this many steps; always at each epoch's end and the last step.
    save_every: int = 0
    #: Measure the held-out set every this many steps; always at each epoch's end and the last step.
    eval_every: int = 0


@dataclass
class Position:
    """Where training stands: optimizer steps taken, the epoch, batches of it already trained on."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


@dataclass
class Scores:
    """Per output (head, depth): summed cross-entropy, top-1 hits and positions scored."""

    loss_sums: list[float]
    correct: list[int]
    counts: list[int]
    #: ``[B, T, outputs]``: output ``k`` at position ``t`` was right / was scored (for evaluation, when asked for).
    hits: torch.Tensor | None = None
    scored: torch.Tensor | None = None

    def losses(self) -> list[float]:
        """Each output's mean cross-entropy (0 where it scored nothing)."""
        return [s / n if n else 0.0 for s, n in zip(self.loss_sums, self.counts)]

    def accuracies(self) -> list[float]:
        """Each output's top-1 accuracy (0 where it scored nothing)."""
        return [c / n if n else 0.0 for c, n in zip(self.correct, self.counts)]

    def weighted_loss(self, decay: float) -> float:
        """The training objective's value: ``sum_k decay ** k * mean loss of output k``."""
        return sum(decay**k * loss for k, loss in enumerate(self.losses()))

    def summed(self, tokens: int, world: World) -> tuple[Scores, int]:
        """These scores and ``tokens`` summed over every rank (the same type back)."""
        n = len(self.counts)
        totals = sum_across([*self.loss_sums, *self.correct, *self.counts, tokens], world)
        return type(self)(totals[:n], totals[n : 2 * n], totals[2 * n : 3 * n]), int(totals[-1])


def save_state(directory: Path, parameters: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, at: Position, options: Any, shape: dict[str, Any]) -> None:
    """Everything a resumed run needs, written atomically (a crash mid-write keeps the last state).
    ``options`` is the trainer's options dataclass; ``shape`` what a resumed run must match."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"position": asdict(at), "parameters": {n: p.detach().cpu() for n, p in parameters.items()},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "options": asdict(options),
             "shape": shape}
    partial = directory / (STATE_FILE + ".partial")
    torch.save(state, partial)
    os.replace(partial, directory / STATE_FILE)


def read_state(directory: str | Path) -> dict[str, Any]:
    """The training state saved in ``directory`` (one-line error when there is none)."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"--resume: no {STATE_FILE} in {str(directory)!r} to resume from")
    return torch.load(path, map_location="cpu", weights_only=True)


def restore_state(state: dict[str, Any], parameters: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                  scheduler: torch.optim.lr_scheduler.LRScheduler) -> Position:
    """Put a saved state back into ``parameters``, ``optimizer`` and ``scheduler``; where it stood."""
    with torch.no_grad():
        for name, param in parameters.items():
            param.copy_(state["parameters"][name])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Position(**state["position"])
