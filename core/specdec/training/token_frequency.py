"""How often the target's replies use each token: the basis of a draft vocabulary.

A drafter that proposes only the target's most frequent reply tokens needs a much smaller output
layer (EAGLE-3's ``d2t`` draft vocabulary; FR-Spec's frequency-ranked drafting for a draft model),
and on a vocabulary of tens of thousands of tokens the output layer is a large share of a small
drafter's time. Counts come from training conversations (the target's own replies), never from
evaluation sets.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def token_counts(sequences: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts over ``(input_ids, loss_mask)`` pairs, on any device: ``(assistant-token counts,
    all-token counts)``, on the CPU."""
    assistant = torch.zeros(vocab_size, dtype=torch.long)
    every = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        ids = ids.long().cpu()
        every += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
        assistant += torch.bincount(ids[mask.bool().cpu()], minlength=vocab_size)[:vocab_size]
    return assistant, every


def frequency_ranking(assistant_counts: torch.Tensor, all_counts: torch.Tensor) -> torch.Tensor:
    """Every token id, most used first: by assistant count, then by count over all text (prompts
    included), then lower id first, so tokens the replies never use still have a defined order.
    Ranked on the CPU (wherever the counts are), as the ranking is saved or indexes CPU tensors."""
    order = torch.arange(assistant_counts.numel())
    for key in (all_counts.cpu(), assistant_counts.cpu()):  # least significant key first; stable sorts keep ties
        order = order[torch.sort(-key[order], stable=True).indices]
    return order


def coverage(assistant_counts: torch.Tensor, kept: torch.Tensor) -> float:
    """Share of the assistant tokens among ``kept`` (token ids, or a mask over the vocabulary),
    which may be on another device than the counts (a head's ``t2d`` on the GPU, say)."""
    total = int(assistant_counts.sum())
    return float(assistant_counts[kept.to(assistant_counts.device)].sum()) / total if total else 0.0
