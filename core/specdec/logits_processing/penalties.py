"""Repetition, frequency and presence penalties (vLLM's ``SamplingParams`` semantics)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.logits_processing.processor import LogitsProcessor
from specdec.logits_processing.rows import VerifyRows


class Penalties(LogitsProcessor):
    """``repetition_penalty`` divides a positive logit (multiplies a negative one) of every token
    seen in the prompt or the output; ``frequency_penalty`` subtracts, per output occurrence of a
    token, and ``presence_penalty`` once per token that occurred in the output.

    Each verify row counts the output up to that row: the committed output plus the drafts on
    its path.
    """

    def __init__(self, prompt_ids: Sequence[int], vocab_size: int, device: torch.device, *,
                 repetition: float = 1.0, frequency: float = 0.0, presence: float = 0.0) -> None:
        self.repetition, self.frequency, self.presence = repetition, frequency, presence
        self.counts = torch.zeros(vocab_size, device=device)
        self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.in_prompt[torch.tensor(list(prompt_ids), dtype=torch.long, device=device)] = True

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        counts = self.counts.expand(len(rows), -1)
        if rows.drafts:
            row_index = [r for r, path in enumerate(rows.paths) for _ in path]
            token_index = [t for path in rows.paths for t in path]
            index = torch.tensor([row_index, token_index], dtype=torch.long, device=logits.device)
            counts = counts.index_put((index[0], index[1]), torch.ones(len(token_index), device=logits.device), accumulate=True)
        seen_in_output = counts > 0
        if self.repetition != 1.0:
            seen = seen_in_output | self.in_prompt
            penalized = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, penalized, logits)
        if self.frequency:
            logits = logits - self.frequency * counts
        if self.presence:
            logits = logits - self.presence * seen_in_output.float()
        return logits

    def accept(self, tokens: Sequence[int]) -> None:
        index = torch.tensor(list(tokens), dtype=torch.long, device=self.counts.device)
        self.counts.index_add_(0, index, torch.ones(len(index), device=self.counts.device))
