"""Which conversations train together: shuffled batches, or batches of similar length.

A batch is right-padded to its longest conversation, and the head computes every padded
position. With conversations of 50 to 750 tokens drawn at random, about a fifth of a batch's
positions are padding; batches of similar length waste little (as ``group_by_length`` in
Hugging Face's Trainer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, Subset

from specdec_eagle3.training.distributed import World


class LengthGroupedBatches(torch.utils.data.Sampler[list[int]]):
    """One rank's batches of conversations of similar length, reshuffled every epoch.

    Each epoch shuffles the conversations, cuts the order into groups of ``group`` batches
    (across every rank), sorts each group by length and cuts it into batches, then shuffles the
    batches: steps still see a random mix of lengths, but each batch's lengths are close. The
    order depends only on ``seed`` and the epoch, so every rank computes the same batches and
    takes every ``world.size``-th one. In a multi-process world the batches that would leave
    ranks uneven are dropped, as ``DistributedSampler(drop_last=True)`` does.

    :param lengths: each conversation's length in tokens, in dataset order.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, world: World, seed: int = 0, group: int = 50) -> None:
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.world = world
        self.seed = seed
        self.span = batch_size * world.size * group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _all_batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.span):
            group = sorted(order[start : start + self.span], key=lambda i: self.lengths[i], reverse=True)
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in shuffled]
        if self.world.distributed:
            batches = batches[: len(batches) // self.world.size * self.world.size]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._all_batches()[self.world.rank :: self.world.size])

    def __len__(self) -> int:
        return len(self._all_batches()[self.world.rank :: self.world.size])


def conversation_lengths(dataset: Dataset) -> list[int]:
    """Each conversation's length in tokens, through any ``Subset`` wrapping (a held-out split)."""
    if isinstance(dataset, Subset):
        lengths = conversation_lengths(dataset.dataset)
        return [lengths[i] for i in dataset.indices]
    return list(dataset.lengths)
