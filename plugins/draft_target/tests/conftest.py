"""Tiny models saved to disk: the target, a smaller draft that shares its tokenizer, and a draft
with a different tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draft_target_helpers import other_tokenizer, save
from specdec.testing import TinyTarget, make_tiny_target
from specdec_draft_target.train import build_draft

# Tiny models: one thread is as fast as two and does not spin against other processes.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny(device: torch.device) -> TinyTarget:
    """The tiny target on the device under test (``SPECDEC_TEST_DEVICE``)."""
    return make_tiny_target(seed=0, device=device)


@pytest.fixture(scope="session")
def target_dir(tiny: TinyTarget, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tiny.model, tiny.tokenizer, tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="session")
def small_draft_dir(tiny: TinyTarget, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target's first layer with its embedding, norm and head: smaller, same tokenizer,
    agrees with the target often but not always."""
    return save(build_draft(tiny.model, [0]), tiny.tokenizer, tmp_path_factory.mktemp("small_draft"))


@pytest.fixture(scope="session")
def mismatched_draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = other_tokenizer()
    model = make_tiny_target(seed=1, num_layers=1).model
    model.resize_token_embeddings(len(tokenizer))
    return save(model, tokenizer, tmp_path_factory.mktemp("mismatched_draft"))
