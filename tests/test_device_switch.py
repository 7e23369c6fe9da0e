"""``SPECDEC_TEST_DEVICE``: the device the tests put their tiny models on, ``cpu`` unless set;
anything else it cannot give stops the run with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.errors import ConfigError
from specdec.testing import DEVICE_ENV, device_under_test

ROOT = Path(__file__).resolve().parent.parent


def test_default_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert device_under_test() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, " CPU ")
    assert device_under_test() == torch.device("cpu")


def test_cuda_needs_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda`` gives the GPU where PyTorch sees one and a one-line error where it does not:
    a run asked for the GPU must not pass quietly on the CPU."""
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_under_test() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=f"{DEVICE_ENV}=cuda, but PyTorch sees no CUDA device here") as info:
        device_under_test()
    assert "\n" not in str(info.value)
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ConfigError, match=f"{DEVICE_ENV}: expected one of cpu, cuda, got 'tpu'"):
        device_under_test()


def test_a_run_asked_for_a_missing_gpu_stops_with_one_line() -> None:
    """pytest stops before collecting anything, with pytest's usage-error status and the reason
    on one line: no test runs, no traceback (CUDA is hidden from it, so this holds on any machine)."""
    env = {**os.environ, DEVICE_ENV: "cuda", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_token_frequency.py")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: {DEVICE_ENV}=cuda, but PyTorch sees no CUDA device"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "passed" not in proc.stdout
