"""The core's catch-up: rows far behind go alone and count as setup, the rest go together."""

import time

import pytest

from specdec import SetupClock, catch_up


def test_rows_far_behind_go_alone_timed_as_setup_and_the_rest_together():
    calls: list[list[int]] = []

    def forward(rows: list[int]) -> list[str]:
        calls.append(rows)
        if len(rows) == 1 and rows[0] in (1, 3):
            time.sleep(0.02)
        return [f"row {i}" for i in rows]

    clock = SetupClock()
    results = catch_up([2, 40, 0, 9, 3], 3, forward, clock)
    assert results == ["row 0", "row 1", None, "row 3", "row 4"]
    assert calls == [[1], [3], [0, 4]]
    assert 0.04 <= clock.seconds < 1.0


def test_steady_rows_cost_no_setup():
    clock = SetupClock()
    assert catch_up([1, 2], 2, lambda rows: [len(rows)] * len(rows), clock) == [2, 2]
    assert clock.seconds == 0.0


def test_time_spent_before_a_failure_still_counts():
    clock = SetupClock()

    def failing(rows: list[int]) -> list[int]:
        time.sleep(0.01)
        raise RuntimeError("head forward failed")

    with pytest.raises(RuntimeError):
        catch_up([5], 1, failing, clock)
    assert clock.seconds >= 0.01
