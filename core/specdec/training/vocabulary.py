"""A training softmax narrowed to the most frequent reply tokens (the trainers' ``--train-vocab``).

The vocabulary projection is a drafter trainer's costliest part (49,152 x 576 multiply-adds per
position for SmolLM2-135M); over the 8,192 most frequent reply tokens of ``training-data/smollm2/``,
which cover 96.4% of the replies, it costs a sixth. As EAGLE-3's draft vocabulary and FR-Spec
narrow a drafter's output, but here only in training: the exported weights still project over
the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from specdec.training.conversations import Example
from specdec.training.token_frequency import coverage, frequency_ranking, token_counts


class TrainingVocabulary:
    """The tokens a training softmax runs over: the ``ids`` (sorted) of the most frequent reply
    tokens. A head's logits are then ``ids``' rows of its projection only, and a position whose
    label lies outside is not scored. The shared projection itself is untouched, so the exported
    heads still draft over the whole vocabulary; what changes is the normalizer the heads are
    trained against, over tokens that hold nearly all of the replies (``coverage``)."""

    def __init__(self, ids: torch.Tensor, vocab_size: int) -> None:
        self.ids = ids.sort().values
        self.index = torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device)
        self.index[self.ids] = torch.arange(len(self.ids), device=ids.device)

    def to(self, device: torch.device) -> TrainingVocabulary:
        return TrainingVocabulary(self.ids.to(device), len(self.index))


def projection(head: torch.nn.Linear, vocabulary: TrainingVocabulary | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``head`` (a vocabulary projection), or its rows of ``vocabulary`` only."""
    if vocabulary is None:
        return head
    weight = head.weight[vocabulary.ids]
    bias = head.bias[vocabulary.ids] if head.bias is not None else None
    return lambda x: F.linear(x, weight, bias)


def check_compact_vocabulary(token_ids: torch.Tensor | None, vocabulary: TrainingVocabulary | None, what: str) -> None:
    """A compact module (one whose output rows are the target ids ``token_ids``, ``None`` for a
    full one) trains over exactly its own ``vocabulary``, and only a compact one trains over one:
    else its logits and the labels would index different tokens. ``what`` names the module."""
    if (vocabulary is None) != (token_ids is None) or (
            vocabulary is not None and not torch.equal(vocabulary.ids.cpu(), token_ids.cpu())):
        raise ValueError(f"{what} over a draft vocabulary trains over that vocabulary, and only such a one")


def training_vocabulary(examples: list[Example], size: int, vocab_size: int,
                        ranking: torch.Tensor | None = None) -> tuple[TrainingVocabulary | None, float]:
    """The ``size`` most frequent reply tokens of the training conversations (or the first
    ``size`` of ``ranking``, a draft vocabulary's token ids most used first), and the share of
    their reply tokens they cover; ``None`` for the whole vocabulary (``size`` 0 or not smaller)."""
    if not size or size >= vocab_size:
        return None, 1.0
    assistant, every = token_counts(((e.input_ids, e.loss_mask) for e in examples), vocab_size)
    kept = (frequency_ranking(assistant, every) if ranking is None else ranking)[:size]
    return TrainingVocabulary(kept, vocab_size), coverage(assistant, kept)
