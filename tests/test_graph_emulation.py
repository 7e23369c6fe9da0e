"""The emulation of CUDA graphs that lets a CPU test recorded drafting (RecordedCalls in
``emulated`` mode): a replay computes what a recorded graph would, including the hazards that
make recorded code go wrong where unrecorded code does not."""

from __future__ import annotations

import logging

import pytest
import torch

from specdec.graph_emulation import emulate_graph
from specdec.static_draft import RecordedCalls


def recorded() -> RecordedCalls:
    return RecordedCalls("emulated", torch.device("cpu"))


def test_a_replay_computes_the_function_of_new_inputs() -> None:
    """Fresh results, views, in-place writes to outside buffers and reshapes that copy (annotated
    as views, yet new memory) all carry the new inputs' values."""
    buffer = torch.zeros(2, 6)

    def fn(x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.t().reshape(6)  # not viewable: reshape copies
        buffer.index_copy_(0, rows, flat[None].softmax(-1))
        return flat.cumsum(0), buffer.max(-1).indices

    calls = recorded()
    for step in range(4):
        x, rows = torch.randn(2, 3), torch.tensor([step % 2])
        got = [t.clone() for t in calls("key", fn, [x, rows])]
        expected_buffer = buffer.clone()
        assert torch.equal(got[0], x.t().reshape(6).cumsum(0))
        assert torch.equal(got[1], expected_buffer.max(-1).indices)
    assert calls.shapes == ["key"]


def test_a_replay_reads_the_tensors_recorded_not_ones_bound_later() -> None:
    """As a CUDA graph does: new values written into a tensor it read are seen; a new tensor bound
    to the same name, and a Python value changed, are not."""
    state = {"scale": torch.tensor(2.0), "offset": 1.0}
    calls = recorded()
    x = torch.arange(3.0)
    calls("key", lambda t: t * state["scale"] + state["offset"], [x])
    state["scale"].fill_(5.0)
    assert torch.equal(calls("key", lambda t: t * state["scale"] + state["offset"], [x]), x * 5 + 1)
    state["scale"], state["offset"] = torch.tensor(7.0), 100.0
    assert torch.equal(calls("key", lambda t: t * state["scale"] + state["offset"], [x]), x * 5 + 1)


def test_a_host_read_cannot_be_recorded(caplog: pytest.LogCaptureFixture) -> None:
    """Reading the device on the host while recording fails, as capture does: the calls then run
    unrecorded, with a warning."""
    with pytest.raises(RuntimeError, match="reads the device on the host"):
        emulate_graph(lambda: torch.ones(2) * float(torch.ones(()).sum()))
    calls = recorded()
    with caplog.at_level(logging.WARNING, logger="specdec.static_draft"):
        out = calls("key", lambda t: t[t > 0], [torch.tensor([1.0, -1.0, 2.0])])
    assert torch.equal(out, torch.tensor([1.0, 2.0])) and calls.mode == "static" and not calls.shapes
    assert "recording a drafting step" in caplog.text
