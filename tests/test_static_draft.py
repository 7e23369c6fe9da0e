"""The static draft cache and recorded calls a drafter runs its steps through in fixed shapes."""

from __future__ import annotations

import pytest
import torch

from specdec import RecordedCalls, RequestKV, SetupClock, StaticDraftCache, grouped_query_attention


def _request_kv(length: int, seed: int, device: torch.device) -> RequestKV:
    generator = torch.Generator().manual_seed(seed)
    kv = RequestKV()
    kv.append(torch.randn(1, 2, length, 4, generator=generator).to(device), torch.randn(1, 2, length, 4, generator=generator).to(device))
    return kv


def test_rows_attend_as_their_own_caches_would(device: torch.device) -> None:
    """Two requests of different lengths loaded side by side, each appending one position at its
    own length: masked to each row's positions, attention over the padded buffers equals
    attention over each request's own grown cache."""
    cache = StaticDraftCache(1, max_rows=2, kv_heads=2, head_dim=4, capacity=16, dtype=torch.float32, device=device)
    requests = [_request_kv(5, 0, device), _request_kv(9, 1, device)]
    assert cache.load([[kv] for kv in requests]) == [5, 9]
    new_keys, new_values = torch.randn(2, 2, 1, 4, device=device), torch.randn(2, 2, 1, 4, device=device)
    query = torch.randn(2, 4, 1, 4, device=device)
    positions = torch.tensor([[5], [9]], device=device)
    cache.write_at(positions, 12)
    keys, values = cache.layer(0).append(new_keys, new_values)
    assert keys.shape == (2, 2, 12, 4)
    mask = (torch.arange(12, device=device)[None] <= positions)[:, None, None, :]
    batched = grouped_query_attention(query, keys, values, mask)
    for row, kv in enumerate(requests):
        own_keys, own_values = kv.append(new_keys[row : row + 1], new_values[row : row + 1])
        alone = grouped_query_attention(query[row : row + 1], own_keys, own_values)
        torch.testing.assert_close(batched[row : row + 1], alone)


def test_rows_append_several_positions_and_values_of_their_own_shape(device: torch.device) -> None:
    """Each row writes several new positions where its plan says, keys and values of different
    shapes (as DeepSeek's latent attention caches them): the buffers then hold each request's own
    cache followed by its new positions, and nothing else changed."""
    cache = StaticDraftCache(2, max_rows=2, kv_heads=1, head_dim=6, capacity=16, dtype=torch.float32, device=device,
                             value_shape=(1, 3))
    requests = []
    for length in (4, 7):
        kv = RequestKV()
        kv.append(torch.randn(1, 1, length, 6, device=device), torch.randn(1, 1, length, 3, device=device))
        requests.append(kv)
    assert cache.load([[kv] for kv in requests]) == [4, 7]  # the first layer only
    new_keys, new_values = torch.randn(2, 1, 3, 6, device=device), torch.randn(2, 1, 3, 3, device=device)
    cache.write_at(torch.tensor([[4, 5, 6], [7, 8, 9]], device=device), 12)
    keys, values = cache.layer(0).append(new_keys, new_values)
    assert keys.shape == (2, 1, 12, 6) and values.shape == (2, 1, 12, 3)
    for row, kv in enumerate(requests):
        own_keys, own_values = kv.append(new_keys[row : row + 1], new_values[row : row + 1])
        torch.testing.assert_close(keys[row, :, : kv.length], own_keys[0])
        torch.testing.assert_close(values[row, :, : kv.length], own_values[0])
    assert not cache.keys[1].any() and not cache.values[1].any()
    with pytest.raises(ValueError, match="layers"):
        cache.load([[requests[0]] * 3])


def test_shapes_are_bucketed_and_bounded(device: torch.device) -> None:
    """A step's rows pad to a batch bucket and its positions to a key length bucket; past the
    cache's size is an error that says so."""
    cache = StaticDraftCache(1, max_rows=8, kv_heads=1, head_dim=2, capacity=4096, dtype=torch.float32, device=device)
    assert cache.shape_for(3, 100) == (4, 512)
    assert cache.shape_for(8, 600) == (8, 2048) and cache.shape_for(1, 3000) == (1, 4096)
    with pytest.raises(ValueError, match="exceed"):
        cache.shape_for(9, 10)


def test_recorded_calls_replay_with_new_inputs(device: torch.device) -> None:
    """A call keyed once is recorded (CUDA graphs) and later calls with other inputs replay it to
    their own results; in ``static`` mode each call simply runs. Only the recording is setup time
    (the policy must not take it for the cost of drafting)."""
    mode = "cuda_graph" if device.type == "cuda" else "static"
    clock = SetupClock()
    calls = RecordedCalls(mode, device, clock)
    setup = []
    runs = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        runs.append(1)
        return (x * 2).cumsum(-1)

    for value in (1.0, 3.0, 5.0, 7.0):
        out = calls("shape", fn, [torch.full((4,), value, device=device)])
        torch.testing.assert_close(out, torch.arange(1, 5, device=device, dtype=torch.float32) * 2 * value)
        setup.append(clock.seconds)
    assert (setup[0] > 0) == (mode == "cuda_graph") and setup == [setup[0]] * 4
    # Recording runs the function three times (two warm-ups, the capture), replaying none.
    assert len(runs) == (3 if mode == "cuda_graph" else 4)
    with pytest.raises(ValueError, match="mode"):
        RecordedCalls("eager", device)


def test_a_call_that_cannot_be_recorded_runs_unrecorded(device: torch.device, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """If recording fails (something a CUDA graph cannot hold), the call still returns its result,
    and every later call runs unrecorded, with one warning: slower, never wrong."""
    import specdec.static_draft as static_draft

    def failing(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(static_draft, "record_graph", failing)
    calls = RecordedCalls("cuda_graph", device)
    with caplog.at_level("WARNING", logger="specdec.static_draft"):
        for value in (1.0, 2.0):
            out = calls("shape", lambda x: x * 3, [torch.full((2,), value, device=device)])
            torch.testing.assert_close(out, torch.full((2,), 3 * value, device=device))
    assert calls.mode == "static" and not calls.shapes
    assert len([r for r in caplog.records if "unrecorded" in r.getMessage()]) == 1

