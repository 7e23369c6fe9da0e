"""The learning-rate schedule the trainers share: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(steps: int, warmup: int, floor: float = 0.1) -> Callable[[int], float]:
    """The factor on the peak rate at step ``s`` (0-based, as ``LambdaLR`` counts): ``(s + 1) / warmup``
    during warm-up, then a cosine from 1 down to ``floor`` at step ``steps``."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return factor
