"""Which conversations train together (batches of similar length), and how a batch is padded.

A batch is right-padded to its longest conversation, and a drafter computes every padded
position. Batched at random, the shipped head's training conversations (50 to 750 tokens)
make about a fifth of the positions padding; batches of similar length waste little (as
``group_by_length`` in Hugging Face's Trainer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, Subset

from specdec.training.distributed import World


class LengthGroupedBatches(torch.utils.data.Sampler[list[int]]):
    """One rank's batches of conversations of similar length, reshuffled every epoch.

    Each epoch shuffles the conversations, cuts the order into groups of ``group`` optimizer
    steps, sorts each group by length and cuts it into steps of ``batch_size x world.size``
    conversations, then shuffles the steps: steps still see a random mix of lengths, but within a
    step the lengths are close. Rank ``r`` takes the ``r``-th batch of every step, so in one step
    every rank works on conversations of about the same length and none waits long for the
    others. The order depends only on ``seed`` and the epoch, so every rank computes the same
    steps. In a multi-process world the last step of an epoch is dropped when it would not give
    every rank a whole batch, as ``DistributedSampler(drop_last=True)`` does.

    :param lengths: each conversation's length in tokens, in dataset order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, world: World, seed: int = 0, group: int = 50) -> None:
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.world = world
        self.seed = seed
        self.group = group
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        """This rank's batches for the current epoch (computed once per epoch)."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        width = self.batch_size * self.world.size
        steps = []
        for start in range(0, len(order), width * self.group):
            group = sorted(order[start : start + width * self.group], key=lambda i: self.lengths[i], reverse=True)
            steps += [group[i : i + width] for i in range(0, len(group), width)]
        if self.world.distributed and steps and len(steps[-1]) < width:
            steps.pop()
        shuffled = torch.randperm(len(steps), generator=generator).tolist()
        rank = self.world.rank * self.batch_size
        batches = [steps[i][rank : rank + self.batch_size] for i in shuffled]
        self._cached = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def conversation_lengths(dataset: Dataset) -> list[int]:
    """Each conversation's length in tokens, through any ``Subset`` wrapping (a held-out split)."""
    if isinstance(dataset, Subset):
        lengths = conversation_lengths(dataset.dataset)
        return [lengths[i] for i in dataset.indices]
    return list(dataset.lengths)


def pad(tensors: list[torch.Tensor], value: float | bool = 0) -> torch.Tensor:
    """Right-pad ``[T, ...]`` tensors to the longest: ``[B, T_max, ...]``."""
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of per-conversation tensors into a batch (masks pad with False, scalars stack)."""
    batch = {}
    for name, first in items[0].items():
        tensors = [item[name] for item in items]
        batch[name] = torch.stack(tensors) if first.dim() == 0 else pad(tensors, False if first.dtype == torch.bool else 0)
    return batch
