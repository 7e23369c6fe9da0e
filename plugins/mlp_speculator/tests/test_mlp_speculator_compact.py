"""A speculator trained over a draft vocabulary (:class:`CompactSpeculator`) exports to IBM's
full layout without changing a draft: narrowed to the same tokens, the export computes exactly
what the compact speculator computes, for every token it may read."""

from __future__ import annotations

import torch

from specdec_mlp_speculator import SpeculatorSpec
from specdec_mlp_speculator.training.compact import CompactSpeculator

VOCAB, HIDDEN, INNER = 50, 12, 16


def test_export_narrowed_to_the_vocabulary_drafts_as_the_compact_speculator() -> None:
    torch.manual_seed(0)
    ids = torch.randperm(VOCAB)[:20]
    for tied in (False, True):
        compact = CompactSpeculator(SpeculatorSpec(HIDDEN, INNER, 3, VOCAB, tied, True, [2, 2, 1]), ids)
        compact.reset_parameters()
        assert compact.emb[0].weight.shape == (21, INNER) and compact.head[0].weight.shape == (20, INNER)
        full = compact.export()
        assert full.spec.vocab_size == VOCAB and full.emb[0].weight.shape == (VOCAB, INNER)
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[ids] = False
        for stage in range(3):  # every token outside shares one embedding row; its output rows are zero
            assert torch.equal(full.emb[stage].weight[outside], compact.emb[stage].weight[-1].expand(VOCAB - 20, -1))
            assert not full.head[stage].weight[outside].any()
        full.narrow_vocabulary(ids.sort().values)
        state = compact.first_state(torch.randn(7, HIDDEN))
        tokens = torch.randint(VOCAB, (7,))  # ids inside and outside the vocabulary
        mine, theirs = state, state
        with torch.no_grad():
            for stage in range(3):
                mine, logits = compact.step(stage, mine, tokens)
                theirs, exported = full.step(stage, theirs, tokens)
                assert torch.equal(logits, exported) and torch.equal(mine, theirs)
                tokens = full.token_map[logits.argmax(-1)]
