"""A speculator trained over a draft vocabulary (:class:`CompactSpeculator`) exports to IBM's
full layout without changing a draft: narrowed to the same tokens, the export computes exactly
what the compact speculator computes, for every token it may read. Its compact checkpoint loads
as that export."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec import ConfigError, ModelLoadError
from specdec_mlp_speculator import CompactSpeculator, SpeculatorSpec, load_speculator, save_speculator

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


def test_compact_checkpoint_loads_as_the_full_export(tmp_path) -> None:
    """Saved compact (its rows and token ids, a sixth of IBM's layout here), the speculator loads
    as its full export; a compact checkpoint with bad token ids or size is a one-line error."""
    torch.manual_seed(0)
    compact = CompactSpeculator(SpeculatorSpec(HIDDEN, INNER, 3, VOCAB, True, True, [2, 2, 1]), torch.randperm(VOCAB)[:20])
    compact.reset_parameters()
    directory = save_speculator(compact, tmp_path / "compact")
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(directory / "model.safetensors"))
    assert config["draft_vocab_size"] == 20 and config["vocab_size"] == VOCAB
    assert tensors["emb.0.weight"].shape == (21, INNER) and tensors["token_ids"].tolist() == compact.token_map.tolist()
    assert "emb.1.weight" not in tensors and "proj.2.weight" not in tensors  # tied tensors once
    loaded, full = load_speculator(directory, HIDDEN, VOCAB), compact.export()
    assert loaded.state_dict().keys() == full.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), full.state_dict().values()))
    assert "draft_vocab_size" not in json.loads((save_speculator(full, tmp_path / "full") / "config.json").read_text())

    save_file({**tensors, "token_ids": tensors["token_ids"].flip(0).contiguous()}, str(directory / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"^token_ids: must be 20 ascending token ids below 50"):
        load_speculator(directory, HIDDEN, VOCAB)
    (directory / "config.json").write_text(json.dumps({**config, "draft_vocab_size": VOCAB}))
    with pytest.raises(ConfigError, match=r"^draft_vocab_size: must be an integer from 0 to below vocab_size"):
        load_speculator(directory, HIDDEN, VOCAB)
