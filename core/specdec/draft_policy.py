"""Speculate only when it pays: cut each proposal to the length with the best expected return.

A verify forward over ``w`` tokens costs ``cost[w]`` single-token forwards; on a CPU in float32,
2-3 tokens can cost twice one token while 4-5 cost barely more, and on bfloat16 the cost is
flat. Each request keeps a running estimate of how often the draft at position ``i`` is accepted
once position ``i`` is reached (``alpha[i]``); the expected number of tokens a step yields with
``L`` drafts is ``1 + sum_{j<=L} prod_{i<=j} alpha[i]``. The engine keeps the longest
``L <= offered`` whose expected tokens per unit of cost come within ``TOLERANCE`` of the best
(``L = 0`` is plain decoding).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec.runner import ModelRunner

#: Weight of the newest step in the running acceptance estimates.
EMA_WEIGHT = 0.2
#: Optimistic start, so a request tries drafting before it has evidence either way.
PRIOR_ACCEPTANCE = 0.6
#: How fast a request that stopped drafting drifts back toward the prior per skipped step.
RELAX_WEIGHT = 0.05
#: A longer draft is kept unless it is expected to do this much worse than the best length:
#: timings on a busy machine spread by a few percent, and a cut must not rest on noise.
TOLERANCE = 0.05


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance of one request's drafts (exponential moving average)."""

    alpha: list[float] = field(default_factory=list)

    def update(self, num_drafted: int, num_accepted: int) -> None:
        for i in range(min(num_drafted, num_accepted + 1)):
            while len(self.alpha) <= i:
                self.alpha.append(PRIOR_ACCEPTANCE)
            hit = 1.0 if i < num_accepted else 0.0
            self.alpha[i] += EMA_WEIGHT * (hit - self.alpha[i])

    def relax(self) -> None:
        """Drift back toward the prior while drafts are being skipped, so drafting is retried."""
        for i, a in enumerate(self.alpha):
            self.alpha[i] = a + RELAX_WEIGHT * (PRIOR_ACCEPTANCE - a)

    def expected_tokens(self, length: int) -> list[float]:
        """Expected tokens per step for every draft length ``0..length``."""
        out, reach = [1.0], 1.0
        for i in range(length):
            reach *= self.alpha[i] if i < len(self.alpha) else PRIOR_ACCEPTANCE
            out.append(out[-1] + reach)
        return out


class ForwardCost:
    """Cost of a target forward by width, relative to a one-token forward, measured once."""

    def __init__(self, relative: list[float]) -> None:
        self.relative = relative

    @classmethod
    def measure(
        cls,
        runner: ModelRunner,
        max_width: int,
        context: int = 256,
        repeats: int = 5,
        sync: Callable[[], None] | None = None,
    ) -> ForwardCost:
        """Time forwards of every width; ``sync`` waits for the device (CUDA) before reading the clock."""
        cache = runner.new_cache()
        runner.forward(cache, [0] * context, last_only=True)
        timings = []
        for width in range(1, max_width + 1):
            runner.forward(cache, [0] * width)  # first call of a shape pays one-time setup
            runner.rollback(cache, width)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                runner.forward(cache, [0] * width)
                if sync:
                    sync()
                samples.append(time.perf_counter() - start)
                runner.rollback(cache, width)
            # The fastest run is the one least disturbed by the rest of the machine.
            timings.append(min(samples))
        return cls([t / timings[0] for t in timings])

    def best_length(self, estimate: AcceptanceEstimate, offered: int) -> int:
        """The longest draft length ``<= offered`` whose expected tokens per unit of cost are
        within ``TOLERANCE`` of the best length's."""
        offered = min(offered, len(self.relative) - 1)
        gains = estimate.expected_tokens(offered)
        rates = [gains[n] / self.relative[n] for n in range(offered + 1)]
        best = max(rates)
        return max(n for n in range(offered + 1) if rates[n] >= best * (1 - TOLERANCE))
