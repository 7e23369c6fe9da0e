"""What a drafter trainer shows and writes as it goes: its progress bar, held-out split, speed
line and ``training.json`` record (the Medusa and MTP trainers share them)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec.progress import Progress
from specdec.training.state import Position


def per_output(values: list[float]) -> str:
    """Per-head (or per-depth) figures on one line."""
    return " ".join(f"{v:.2f}" for v in values)


def split_heldout(dataset: torch.utils.data.Dataset, fraction: float, seed: int) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """``(training, held out)``: a seeded random ``fraction`` of the conversations (at least one) held out."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    held = max(1, round(fraction * len(dataset)))
    return torch.utils.data.Subset(dataset, sorted(order[held:])), torch.utils.data.Subset(dataset, sorted(order[:held]))


def heldout_note(heldout: torch.utils.data.Dataset | None) -> str:
    return f", {len(heldout)} held out" if heldout is not None else ""


def write_record(output: str | Path, at: Position, options: Any, data: tuple[str, ...], eval_data: tuple[str, ...],
                 heldout: torch.utils.data.Dataset | None, **fields: Any) -> None:
    """``training.json`` in ``output``: the command, the position, the options, the data and ``fields``
    (the latest training and held-out figures)."""
    record = {"command": shlex.join(["specdec", *sys.argv[1:]]), "position": asdict(at), "options": asdict(options),
              "data": list(data), "eval_data": list(eval_data),
              "heldout_conversations": len(heldout) if heldout is not None else 0, **fields}
    (Path(output) / "training.json").write_text(json.dumps(record, indent=2) + "\n")


class TrainingProgress:
    """A trainer's progress bar: steps, epoch, smoothed loss and per-output top-1, tokens/s and
    s/step since this run began (a resumed run starts at its saved position)."""

    def __init__(self, console: Console, total_steps: int, saved: dict[str, Any] | None) -> None:
        self.console = console
        self.total_steps = total_steps
        self.start = Position(**saved["position"]) if saved is not None else Position()
        self.tokens = 0
        self._smooth: dict[str, list[float]] = {}
        self._began = time.monotonic()
        self._progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("epoch {task.fields[epoch]}"), TextColumn("loss {task.fields[loss]:.3f}"),
                                  TextColumn("top-1 {task.fields[acc]}"), TextColumn("{task.fields[speed]}"),
                                  TimeElapsedColumn(), TimeRemainingColumn(), console=console)

    def __enter__(self) -> TrainingProgress:
        self._progress.__enter__()
        self._task = self._progress.add_task("fit", total=self.total_steps, epoch=self.start.epoch + 1, loss=float("nan"),
                                             acc="-", speed="", completed=self.start.step)
        if self.start.step:
            self.print(f"resuming from step {self.start.step} (epoch {self.start.epoch + 1}, batch {self.start.batch})")
        self._began = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def step(self, step: int, epoch: int, loss: float, accuracies: list[float], tokens: int) -> None:
        """One optimizer step's figures (loss and accuracies smoothed over the last few steps)."""
        for name, values in (("loss", [loss]), ("acc", accuracies)):
            old = self._smooth.get(name)
            self._smooth[name] = values if old is None else [0.9 * a + 0.1 * b for a, b in zip(old, values)]
        self.tokens += tokens
        elapsed = time.monotonic() - self._began
        speed = f"{self.tokens / elapsed:.0f} tok/s {elapsed / (step - self.start.step):.1f} s/step" if elapsed > 0 else ""
        self._progress.update(self._task, completed=step, epoch=epoch + 1, loss=self._smooth["loss"][0],
                              acc=per_output(self._smooth["acc"]), speed=speed)

    def print(self, text: str) -> None:
        self._progress.console.print(text)

    def speed_line(self, at: Position) -> str | None:
        """The run's throughput once it ends (``None`` when it took no step)."""
        steps, took = at.step - self.start.step, time.monotonic() - self._began
        if steps <= 0:
            return None
        return (f"{steps} steps in {took:.0f} s: {self.tokens / took:.0f} tokens/s, "
                f"{took / steps:.2f} s/step (held-out measurements and saves included)")
