"""Token-level rules: ``logit_bias``, ``min_tokens`` and ``bad_words`` (vLLM's semantics)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from specdec.logits_processing.processor import LogitsProcessor
from specdec.logits_processing.rows import VerifyRows


class LogitBias(LogitsProcessor):
    """Adds ``bias[token]`` to that token's logit at every position (OpenAI's ``logit_bias``)."""

    def __init__(self, bias: dict[int, float], vocab_size: int, device: torch.device) -> None:
        self.bias = torch.zeros(vocab_size, device=device)
        self.bias[torch.tensor(list(bias), dtype=torch.long, device=device)] = torch.tensor(
            list(bias.values()), dtype=torch.float32, device=device)

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        return logits + self.bias


class MinTokens(LogitsProcessor):
    """Forbids the stop tokens (EOS and ``stop_token_ids``) until ``min_tokens`` tokens are out."""

    def __init__(self, min_tokens: int, stop_ids: Iterable[int]) -> None:
        self.min_tokens = min_tokens
        self.stop_ids = sorted(set(stop_ids))

    def _open_depth(self, rows: VerifyRows) -> int:
        """Rows of depth below this choose a token before ``min_tokens`` are out."""
        return self.min_tokens - rows.request.num_output_tokens

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        limit = self._open_depth(rows)
        closed = [row for row, path in enumerate(rows.paths) if len(path) < limit]
        if closed and self.stop_ids:
            logits[torch.tensor(closed)[:, None], torch.tensor(self.stop_ids)[None]] = float("-inf")
        return logits

    def usable_drafts(self, rows: VerifyRows) -> int:
        limit, stops = self._open_depth(rows), set(self.stop_ids)
        for node, token in enumerate(rows.drafts):
            if token in stops and len(rows.paths[rows.row_parent(node + 1)]) < limit:
                return node
        return len(rows.drafts)


def bad_word_sequences(tokenizer: Any, words: Sequence[str]) -> list[tuple[int, ...]]:
    """The token sequences of each bad word, alone and after a space (as vLLM tokenizes them:
    the spaced form only when it is a different first token of the same length)."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if plain:
            sequences.append(plain)
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            sequences.append(spaced)
    return sequences


class BadWords(LogitsProcessor):
    """Forbids the last token of a bad word's tokens when the output ends with the ones before it."""

    def __init__(self, sequences: Sequence[tuple[int, ...]]) -> None:
        self.sequences = list(sequences)

    def _banned(self, rows: VerifyRows, row: int) -> list[int]:
        output = rows.request.output_ids
        path = rows.paths[row]
        banned = []
        for seq in self.sequences:
            need = len(seq) - 1
            if need > len(output) + len(path):
                continue
            recent = tuple(output[max(len(output) - need, 0):]) + path
            if recent[len(recent) - need:] == seq[:-1]:
                banned.append(seq[-1])
        return banned

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        for row in range(len(rows)):
            banned = self._banned(rows, row)
            if banned:
                logits[row, banned] = float("-inf")
        return logits

    def usable_drafts(self, rows: VerifyRows) -> int:
        for node, token in enumerate(rows.drafts):
            if token in self._banned(rows, rows.row_parent(node + 1)):
                return node
        return len(rows.drafts)
