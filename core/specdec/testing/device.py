"""The device tests put their tiny models on: ``SPECDEC_TEST_DEVICE``, ``cpu`` unless set.

``SPECDEC_TEST_DEVICE=cuda pytest`` runs the device-agnostic tests (those on the tiny-model
fixtures and the conformance suite) with their models on the GPU; the default keeps every test on
the CPU, as CI runs it.
"""

from __future__ import annotations

import torch

from specdec.environment import env_choice
from specdec.errors import ConfigError

DEVICE_ENV = "SPECDEC_TEST_DEVICE"
DEVICES = ("cpu", "cuda")


def device_under_test() -> torch.device:
    """The device ``SPECDEC_TEST_DEVICE`` names; a ``ConfigError`` for an unknown name, or for
    ``cuda`` where PyTorch sees no CUDA device (a test run asked for the GPU must not pass on the CPU)."""
    name = env_choice(DEVICE_ENV, DEVICES)
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{DEVICE_ENV}=cuda, but PyTorch sees no CUDA device here (torch {torch.__version__}); "
                          f"unset it to test on the CPU")
    return torch.device(name)
