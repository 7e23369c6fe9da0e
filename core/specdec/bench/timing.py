"""Timing a call the way the micro-benchmarks do (``specdec bench-kernels``, scripts/profile_step.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` calls, after one warm-up call (which
    compiles a kernel or records a graph); ``sync`` waits for the device before each clock read."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
