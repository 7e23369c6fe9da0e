"""Training conversations read, tokenized and served one by one (the online source of every trainer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from specdec.errors import ConfigError
from specdec.training.conversations import Example, tokenize_all
from specdec.training.synthesize import read_conversations


def load_examples(data: tuple[str, ...] | list[str], tokenizer: Any, max_length: int, limit: int | None = None,
                  option: str = "--data", purpose: str = "train on") -> list[Example]:
    """The usable conversations of the ``data`` files (the first ``limit`` records), tokenized; a
    one-line error naming ``option`` when none has an assistant reply."""
    records = [r for path in data for r in read_conversations(path)][: limit or None]
    examples = tokenize_all(records, tokenizer, max_length)
    if not examples:
        raise ConfigError(f"{option}: no conversation has an assistant reply to {purpose}")
    return examples


class ExampleDataset(torch.utils.data.Dataset):
    """Tokenized conversations: item ``n`` is ``input_ids``, ``loss_mask`` and ``length``."""

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples
        #: Each conversation's ``conversation_id``, in dataset order.
        self.ids = [e.conversation_id for e in examples]
        #: Each conversation's length in tokens, in dataset order.
        self.lengths = [len(e.input_ids) for e in examples]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        e = self.examples[item]
        return {"input_ids": e.input_ids, "loss_mask": e.loss_mask, "length": torch.tensor(len(e.input_ids))}

    def sequences(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every conversation."""
        return ((e.input_ids, e.loss_mask) for e in self.examples)
