"""Draft-vocabulary calibration: the target tokens the training replies use most.

As in the EAGLE-3 authors' code and ModelOpt's ``calibrate_draft_vocab.py``: count the assistant
tokens of the training data (:mod:`specdec.training.token_frequency`), keep the
``draft_vocab_size`` most frequent (ties: more frequent over all text, then lower id), sort them
by id, and describe them by ``d2t`` (target id = draft id + ``d2t[draft id]``) and ``t2d`` (a
boolean over the target vocabulary). When the replies use fewer distinct tokens than
``draft_vocab_size``, the most frequent of the remaining tokens (prompts included) fill the rest,
then the lowest unused ids, so the draft vocabulary always has exactly the requested size.
"""

from __future__ import annotations

import torch

from specdec import ConfigError
from specdec.training import frequency_ranking


def calibrate(assistant_counts: torch.Tensor, all_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` for the ``draft_vocab_size`` most frequent target tokens."""
    vocab_size = assistant_counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ConfigError(f"--draft-vocab-size: must be in 1..{vocab_size} (the target's vocabulary), got {draft_vocab_size}")
    chosen = frequency_ranking(assistant_counts, all_counts)[:draft_vocab_size].sort().values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d
