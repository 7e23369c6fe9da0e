"""The tiny target on the device under test."""

from __future__ import annotations

import pytest
import torch

from specdec.testing import TinyTarget, make_tiny_target


@pytest.fixture(scope="session")
def tiny(device: torch.device) -> TinyTarget:
    return make_tiny_target(seed=0, device=device)
