"""Token counting and ranking for draft vocabularies (EAGLE-3's d2t, draft_target's draft_vocab_size)."""

from __future__ import annotations

import torch

from specdec.training.token_frequency import coverage, frequency_ranking, token_counts


def test_counts_split_replies_from_all_text() -> None:
    ids = torch.tensor([5, 1, 1, 2, 5, 5])
    mask = torch.tensor([0, 1, 1, 0, 1, 0], dtype=torch.bool)
    replies, every = token_counts([(ids, mask), (torch.tensor([2]), torch.tensor([True]))], 6)
    assert replies.tolist() == [0, 2, 1, 0, 0, 1]
    assert every.tolist() == [0, 2, 2, 0, 0, 3]


def test_ranking_orders_by_replies_then_all_text_then_id() -> None:
    """Reply count decides; a tie goes to the token more used over all text, then the lower id;
    tokens never seen still get a place, so any size can be cut from the ranking."""
    replies = torch.tensor([0, 3, 1, 1, 0, 3])
    every = torch.tensor([9, 3, 1, 5, 0, 3])
    assert frequency_ranking(replies, every).tolist() == [1, 5, 3, 2, 0, 4]


def test_coverage_takes_ids_or_a_mask() -> None:
    replies = torch.tensor([6, 3, 1, 0])
    assert coverage(replies, torch.tensor([0, 2])) == coverage(replies, torch.tensor([True, False, True, False])) == 0.7
    assert coverage(torch.zeros(4, dtype=torch.long), torch.tensor([0])) == 0.0


def test_tensors_on_the_device_under_test(device: torch.device) -> None:
    """Ids, masks and kept tokens on the device under test give the CPU answers: training counts
    on the CPU while a head's ``t2d`` lives on the GPU."""
    ids = torch.tensor([5, 1, 1, 2, 5, 5], device=device)
    mask = torch.tensor([0, 1, 1, 0, 1, 0], dtype=torch.bool, device=device)
    replies, every = token_counts([(ids, mask)], 6)
    assert replies.device.type == every.device.type == "cpu" and replies.tolist() == [0, 2, 0, 0, 0, 1]
    assert torch.equal(frequency_ranking(replies.to(device), every.to(device)), frequency_ranking(replies, every))
    kept = torch.tensor([True, True, False, False, False, False], device=device)
    assert coverage(replies, kept) == coverage(replies.to(device), kept.cpu()) == 2 / 3
