"""Settings for every test in the repository: the core's tests/ and each plugin's tests/."""

import pytest
import torch

from specdec.errors import ConfigError
from specdec.testing import device_under_test

# The test models are tiny: one intra-op thread is as fast as two when the machine is idle, and
# avoids OpenMP spin-waiting that slows them many times over when other processes share the CPUs.
# Tests on the real model restore all cores for themselves.
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """Check ``SPECDEC_TEST_DEVICE`` before anything is collected: a run asked for a GPU the
    machine lacks stops with one line, not an error in every test."""
    try:
        device_under_test()
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the tests put their tiny models: ``SPECDEC_TEST_DEVICE`` (``cpu`` unless set)."""
    return device_under_test()
