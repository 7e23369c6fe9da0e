"""The drafter trainers' core loop on a toy trainee (a bigram model over the conversations): a run
interrupted after a save and resumed takes exactly the steps of an uninterrupted one (same
weights and Adam moments, bit for bit), crossing an epoch boundary; held-out measurements and
saves come where the options say; a saved state of another shape is refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from specdec.errors import ConfigError
from specdec.testing.training import Interrupted, interrupted_after_save
from specdec.training.conversations import Example
from specdec.training.distributed import World
from specdec.training.examples import ExampleDataset
from specdec.training.loop import StepReport, check_shape, fit
from specdec.training.state import STATE_FILE, Position, Scores, TrainingOptions, read_state

VOCAB = 16


class Bigram:
    """Predicts token ``t + 1`` from token ``t`` at assistant positions."""

    def __init__(self, width: int = 8) -> None:
        self.module = torch.nn.Sequential(torch.nn.Embedding(VOCAB, width), torch.nn.Linear(width, VOCAB))
        torch.nn.init.normal_(self.module[0].weight, generator=torch.Generator().manual_seed(0))
        torch.nn.init.normal_(self.module[1].weight, std=0.1, generator=torch.Generator().manual_seed(1))
        torch.nn.init.zeros_(self.module[1].bias)
        self.evaluations = 0

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.module.named_parameters())

    def shape(self) -> dict[str, Any]:
        return {"width": self.module[0].embedding_dim}

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:]
        logits = self.module(ids[:, :-1])[mask]
        labels = ids[:, 1:][mask]
        loss = F.cross_entropy(logits, labels, reduction="sum")
        (loss / max(1, labels.numel())).backward()
        return Scores([float(loss.detach())], [int((logits.argmax(-1) == labels).sum())], [labels.numel()])

    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> int:
        self.evaluations += 1
        return self.evaluations


def dataset(count: int = 8) -> ExampleDataset:
    generator = torch.Generator().manual_seed(0)
    examples = []
    for n in range(count):
        length = 6 + n % 4
        mask = torch.zeros(length, dtype=torch.bool)
        mask[2:] = True
        examples.append(Example(f"c{n}", torch.randint(0, VOCAB, (length,), generator=generator), mask))
    return ExampleDataset(examples)


def options(**changes: Any) -> TrainingOptions:
    # 8 conversations in batches of 2: 4 steps an epoch, so 7 steps end in epoch 2 at batch 3.
    return TrainingOptions(**{"steps": 7, "batch_size": 2, "lr": 1e-2, "warmup": 2, "save_every": 3, **changes})


def test_a_resumed_run_takes_the_steps_of_an_uninterrupted_one(tmp_path: Path) -> None:
    whole, stopped = Bigram(), Bigram()
    end = fit(whole, dataset(), options(), World(), tmp_path / "whole")
    assert end == Position(7, 1, 3)
    with interrupted_after_save(3), pytest.raises(Interrupted):
        fit(stopped, dataset(), options(), World(), tmp_path / "resumed")
    saved = read_state(tmp_path / "resumed")
    assert saved["position"] == {"step": 3, "epoch": 0, "batch": 3}
    resumed = Bigram()
    assert fit(resumed, dataset(), options(), World(), tmp_path / "resumed", resume=saved) == end
    assert all(torch.equal(a, b) for a, b in zip(whole.module.parameters(), resumed.module.parameters()))
    assert not torch.equal(whole.module[1].weight, Bigram().module[1].weight)
    a, b = (torch.load(tmp_path / d / STATE_FILE, weights_only=True) for d in ("whole", "resumed"))
    assert a["position"] == b["position"] == {"step": 7, "epoch": 1, "batch": 3}
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(x["exp_avg"], y["exp_avg"]) and torch.equal(x["exp_avg_sq"], y["exp_avg_sq"])


def test_heldout_measurements_and_saves_come_when_asked() -> None:
    reports: list[StepReport] = []
    saves: list[Position] = []
    trainee = Bigram()
    fit(trainee, dataset(), options(eval_every=3), World(), on_step=reports.append, on_save=saves.append,
        heldout=dataset(2))
    # Every 3 steps, each epoch's end (step 4) and the last step (7).
    assert [r.step for r in reports if r.heldout is not None] == [3, 4, 6, 7]
    assert [s.step for s in saves] == [3, 4, 6, 7]
    assert [r.step for r in reports] == list(range(1, 8)) and reports[-1].tokens > 0
    assert reports[-1].losses[0] < reports[0].losses[0]


def test_a_state_of_another_shape_is_refused(tmp_path: Path) -> None:
    fit(Bigram(), dataset(), options(steps=1), World(), tmp_path)
    with pytest.raises(ConfigError, match=r"--resume: the saved state holds \{'width': 8\}, this run asks for \{'width': 4\}"):
        fit(Bigram(width=4), dataset(), options(steps=2), World(), tmp_path, resume=read_state(tmp_path))
    with pytest.raises(ConfigError, match="holds width 8, this run asks for width 4"):
        check_shape(read_state(tmp_path), {"width": 4}, lambda shape: f"width {shape['width']}")
