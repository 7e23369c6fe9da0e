"""The bench's speedup interval: exact when every timed run agrees, honest when they scatter."""

from __future__ import annotations

import random

from specdec.bench.interval import TimedPair, speedup_interval


def _pair(ratio: float, tokens: int = 100, seconds: float = 1.0) -> TimedPair:
    return TimedPair(tokens, seconds / ratio, tokens, seconds)


def test_interval_needs_two_timed_runs() -> None:
    assert speedup_interval([]) is None
    assert speedup_interval([_pair(1.2)]) is None


def test_runs_that_agree_give_a_point_interval() -> None:
    """Every timed run at 1.25x: whatever the resample, the ratio is 1.25."""
    low, high = speedup_interval([_pair(1.25, tokens=t) for t in (50, 80, 120)])
    assert abs(low - 1.25) < 1e-9 and abs(high - 1.25) < 1e-9


def test_interval_is_seeded() -> None:
    pairs = [_pair(r) for r in (0.9, 1.1, 1.0, 1.3)]
    assert speedup_interval(pairs) == speedup_interval(pairs)


def test_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    """Timed runs with a true speedup of 1.0 and 10% machine noise on every timing: over many
    simulated benchmarks, the 95% interval contains 1.0 in roughly 95% of them, and more runs
    narrow it."""
    rng = random.Random(1)

    def bench(runs: int) -> tuple[float, float]:
        pairs = [TimedPair(100, rng.lognormvariate(0, 0.1), 100, rng.lognormvariate(0, 0.1)) for _ in range(runs)]
        interval = speedup_interval(pairs, resamples=400, seed=rng.randrange(1 << 30))
        assert interval is not None
        return interval

    intervals = [bench(20) for _ in range(150)]
    coverage = sum(low <= 1.0 <= high for low, high in intervals) / len(intervals)
    assert 0.85 <= coverage <= 0.99
    width = sum(high - low for low, high in intervals) / len(intervals)
    wide = sum(high - low for low, high in (bench(5) for _ in range(30))) / 30
    assert wide > 1.5 * width
