"""Length-grouped batches: every conversation once per epoch, split across ranks, with little padding."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Subset

from specdec.training.batching import LengthGroupedBatches, conversation_lengths
from specdec.training.distributed import World

_RNG = random.Random(0)
LENGTHS = [_RNG.randint(50, 750) for _ in range(1003)]


def _padded(batches: list[list[int]]) -> int:
    return sum(max(LENGTHS[i] for i in batch) * len(batch) for batch in batches)


def test_one_process_sees_every_conversation_once_per_epoch_with_little_padding() -> None:
    """The batches of an epoch partition the data; padding falls from over a fifth of the tokens
    (shuffled batches of these lengths) to a few percent; the same seed and epoch give the same
    batches, another epoch others."""
    sampler = LengthGroupedBatches(LENGTHS, 4, World(), seed=3)
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    assert all(1 <= len(batch) <= 4 for batch in batches) and len(sampler) == len(batches)
    order = random.Random(1).sample(range(len(LENGTHS)), len(LENGTHS))
    shuffled = [order[i : i + 4] for i in range(0, len(order), 4)]
    real = sum(LENGTHS)
    assert _padded(shuffled) > 1.2 * real and _padded(batches) < 1.05 * real, (_padded(shuffled) / real, _padded(batches) / real)
    assert list(LengthGroupedBatches(LENGTHS, 4, World(), seed=3)) == batches
    sampler.set_epoch(1)
    assert list(sampler) != batches
    # Steps still see a mix of lengths: the batch order is not sorted.
    longest = [max(LENGTHS[i] for i in batch) for batch in batches]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)


def test_ranks_take_disjoint_equal_shares_of_each_step() -> None:
    """Two ranks compute the same steps and each takes its own batch of every one: equal counts,
    disjoint, together everything but the last step when it is short, and within a step the two
    batches' lengths are close (neither rank waits long for the other)."""
    shares = [list(LengthGroupedBatches(LENGTHS, 4, World(rank, 2), seed=0)) for rank in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == len(LENGTHS) // 8
    assert all(len(batch) == 4 for share in shares for batch in share)
    seen = [i for share in shares for batch in share for i in batch]
    assert len(seen) == len(set(seen)) == len(LENGTHS) // 8 * 8
    gaps = [abs(max(LENGTHS[i] for i in a) - max(LENGTHS[i] for i in b)) for a, b in zip(*shares)]
    assert sum(gaps) / len(gaps) < 20, sum(gaps) / len(gaps)


def test_lengths_follow_a_subset() -> None:
    """A held-out split wraps the dataset in ``Subset``; its lengths are the kept conversations'."""

    class Conversations(torch.utils.data.Dataset):
        lengths = [5, 7, 9, 11]

    assert conversation_lengths(Subset(Subset(Conversations(), [3, 1, 2]), [0, 2])) == [11, 9]
