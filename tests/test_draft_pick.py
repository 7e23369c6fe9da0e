"""The core's draft-token pick: greedy picks map draft-vocabulary rows to target ids, sampled
picks carry a distribution over the target's vocabulary that is zero off the kept tokens, and a
seeded pick is the token the target's own noise would draw from that distribution."""

from __future__ import annotations

import torch

from specdec import Request, SamplingParams, pick_drafts
from specdec.sampling import PositionNoise, logits_to_probs, race

VOCAB = 10
KEPT = torch.tensor([1, 4, 6, 9])


def request(params: SamplingParams, seed: int | None = None) -> Request:
    noise = PositionNoise(seed, VOCAB) if seed is not None else None
    return Request(0, [3, 5, 7], 3, params, noise)


def test_greedy_picks_map_draft_rows_to_target_ids():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    greedy = request(SamplingParams(temperature=0.0))
    assert pick_drafts(logits, [greedy, greedy], [0, 1], KEPT, VOCAB) == [(4, None), (1, None)]
    # Without a draft vocabulary the row index is the target id.
    assert pick_drafts(logits[:1], [greedy], [0], None, VOCAB) == [(1, None)]


def test_sampled_picks_carry_a_distribution_over_the_target_vocabulary():
    torch.manual_seed(0)
    logits = torch.randn(3, len(KEPT))
    sampled = request(SamplingParams(temperature=0.8, top_k=3))
    picks = pick_drafts(logits, [sampled] * 3, [0, 1, 2], KEPT, VOCAB)
    off = [t for t in range(VOCAB) if t not in KEPT.tolist()]
    for (token, dist), row in zip(picks, logits):
        assert token in KEPT.tolist() and dist.shape == (VOCAB,)
        assert float(dist[off].sum()) == 0 and torch.isclose(dist.sum(), torch.tensor(1.0))
        # The request's own shaping over the kept tokens: temperature and top-k.
        torch.testing.assert_close(dist[KEPT], logits_to_probs(row, sampled.params))
        assert int((dist > 0).sum()) == 3


def test_seeded_picks_use_the_positions_noise():
    logits = torch.randn(2, len(KEPT), generator=torch.Generator().manual_seed(1))
    seeded = request(SamplingParams(temperature=1.0, seed=7), seed=7)
    picks = pick_drafts(logits, [seeded, seeded], [0, 1], KEPT, VOCAB)
    for offset, (token, dist) in enumerate(picks):
        assert token == int(race(dist, seeded.noise.at(len(seeded.token_ids) + offset)))


def test_kept_rows_narrow_a_drafters_own_vocabulary_by_rank():
    """A projection whose rows stand for target ids (EAGLE-3's d2t) keeps the rows of its best
    ranked tokens, in row order; asking for more than it has names the field."""
    import pytest

    from specdec import ConfigError
    from specdec.draft_vocab import kept_rows

    ranking = torch.tensor([7, 2, 9, 0, 4, 1, 3, 5, 6, 8])  # token 7 is used most
    row_ids = torch.tensor([1, 2, 4, 8, 9])
    assert kept_rows(ranking, row_ids, 3).tolist() == [1, 2, 4]  # tokens 2, 9, 4
    with pytest.raises(ConfigError, match="draft_vocab_size: 6 exceeds the drafter's own vocabulary of 5"):
        kept_rows(ranking, row_ids, 6)
