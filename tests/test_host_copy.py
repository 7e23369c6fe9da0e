"""HostCopy brings a small device tensor's values to the host without a wait of its own once the
stream has been synchronized past it: what lets the engine's finite check ride on the forward's
sync (tests/test_host_reads.py counts the step's reads)."""

from __future__ import annotations

import pytest
import torch

from specdec.host_copy import HostCopy
from specdec.testing import device_under_test


def test_the_copy_holds_the_values_the_tensor_had_when_queued(device: torch.device) -> None:
    flags = torch.tensor([True, False, True], device=device)
    copy = HostCopy(flags)
    flags.fill_(False)  # a later change on the device does not reach the copy
    assert copy.tolist() == [True, False, True]
    assert HostCopy(torch.arange(4, device=device).reshape(2, 2)).tolist() == [[0, 1], [2, 3]]


@pytest.mark.skipif(device_under_test().type != "cuda", reason="a host sync exists on CUDA only")
def test_reading_after_a_sync_does_not_sync_again() -> None:
    logits = torch.randn(8, 4096, device="cuda")
    copy = HostCopy(torch.isfinite(logits @ logits.T).all(-1))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any sync inside the read raises
    try:
        assert copy.tolist() == [True] * 8
    finally:
        torch.cuda.set_sync_debug_mode("default")
