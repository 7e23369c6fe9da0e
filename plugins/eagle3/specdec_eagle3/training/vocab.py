"""Draft-vocabulary calibration: the target tokens the training replies use most.

As in the EAGLE-3 authors' code and ModelOpt's ``calibrate_draft_vocab.py``: count the assistant
tokens of the training data, keep the ``draft_vocab_size`` most frequent (ties: lower id first),
sort them by id, and describe them by ``d2t`` (target id = draft id + ``d2t[draft id]``) and
``t2d`` (a boolean over the target vocabulary). When the replies use fewer distinct tokens than
``draft_vocab_size``, the most frequent of the remaining tokens (prompts included) fill the rest,
then the lowest unused ids, so the draft vocabulary always has exactly the requested size.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specdec.errors import ConfigError


def token_counts(sequences: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts over ``(input_ids, loss_mask)`` pairs: ``(assistant-token counts, all-token counts)``."""
    assistant = torch.zeros(vocab_size, dtype=torch.long)
    every = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        ids = ids.long()
        every += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
        assistant += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
    return assistant, every


def calibrate(assistant_counts: torch.Tensor, all_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` for the ``draft_vocab_size`` most frequent target tokens."""
    vocab_size = assistant_counts.numel()
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ConfigError(f"--draft-vocab-size: must be in 1..{vocab_size} (the target's vocabulary), got {draft_vocab_size}")
    # One sort key: assistant count first, then all-token count, then lower id.
    ids = torch.arange(vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(assistant_counts[i]), -int(all_counts[i]), i))
    chosen = ids[order[:draft_vocab_size]].sort().values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def coverage(assistant_counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of the assistant tokens the draft vocabulary covers."""
    total = int(assistant_counts.sum())
    return float(assistant_counts[t2d].sum()) / total if total else 0.0
