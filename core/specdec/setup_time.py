"""Catching a drafter's state up on a request, and timing that apart from drafting.

A drafter that keeps state per request (a draft model's cache, an EAGLE-3 head's or MTP layer's
own KV cache) feeds it the tokens the target emitted since the request last drafted. A steady
drafting step leaves every request a few tokens behind; a request just added, or one whose
drafting the engine's policy paused, can be hundreds behind. Catching those up is setup, not the
per-token cost of drafting: the drafter times it with a :class:`SetupClock`, reports the total as
:meth:`~specdec.resources.ResourceManager.setup_seconds`, and the engine's policy charges it to
the decision to resume drafting instead (:class:`~specdec.draft_policy.ResumeCost`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["SetupClock", "catch_up"]

T = TypeVar("T")


class SetupClock:
    """Seconds spent so far on setup inside drafting calls."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count the block's time as setup, also when it raises (the time was spent)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - began


def catch_up(behind: Sequence[int], steady: int, forward: Callable[[list[int]], Sequence[T]],
             clock: SetupClock) -> list[T | None]:
    """Bring rows up to date: row ``i`` has ``behind[i]`` positions to take in.

    Rows at most ``steady`` behind (what a steady drafting step leaves) go in one call,
    ``forward(rows)``; each row further behind goes alone, timed as setup on ``clock``, since
    padding every other row to its length would multiply the work. ``forward`` returns one
    result per row it is given. Returns each row's result, ``None`` for rows with nothing to take in.
    """
    results: dict[int, T] = {}
    for i, count in enumerate(behind):
        if count > steady:
            with clock.timing():
                results[i] = forward([i])[0]
    together = [i for i, count in enumerate(behind) if 0 < count <= steady]
    if together:
        results.update(zip(together, forward(together), strict=True))
    return [results.get(i) for i in range(len(behind))]
