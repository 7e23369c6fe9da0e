"""How far a measured speedup can be trusted: a bootstrap interval over the bench's timed runs.

A shared machine's speed drifts by several percent over seconds, so a speedup from a handful of
timed runs can be off by more than the effect being measured. Each timed run (one turn at batch
size 1, one batch above it) pairs a plain and a speculative timing taken seconds apart. Drawing
timed runs with replacement, pairs kept intact, and recomputing the throughput ratio each time
shows how much the ratio depends on which runs happened to land on a slow moment: the percentile
interval of those ratios is what the bench reports. With fewer than two timed runs there is
nothing to resample and no interval.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

#: Resamples per interval: enough for stable 2.5% / 97.5% percentiles, a few ms per category.
RESAMPLES = 2000


@dataclass(frozen=True)
class TimedPair:
    """Tokens and seconds of the method and of the baseline in one timed run."""

    tokens: int
    seconds: float
    baseline_tokens: int
    baseline_seconds: float


def _ratio(pairs: Sequence[TimedPair]) -> float | None:
    seconds = sum(p.seconds for p in pairs)
    base_tokens = sum(p.baseline_tokens for p in pairs)
    if not seconds or not base_tokens:
        return None
    base_seconds = sum(p.baseline_seconds for p in pairs)
    return (sum(p.tokens for p in pairs) / seconds) / (base_tokens / base_seconds)


def speedup_interval(
    pairs: Sequence[TimedPair], level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the throughput ratio (method over baseline) at ``level``.

    Seeded, so the same results always give the same interval.
    """
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    ratios = sorted(
        r for r in (_ratio(rng.choices(pairs, k=len(pairs))) for _ in range(resamples)) if r is not None
    )
    if not ratios:
        return None
    tail = (1 - level) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[round((1 - tail) * (len(ratios) - 1))]
    return low, high
