"""A drafter trained over a draft vocabulary (a compact drafter: its output layer holds those
tokens' rows only) exports to Apple's full layout without changing a draft, and its compact
checkpoint loads as the compact drafter; bad compact checkpoints are one-line errors naming the
field. Loaded by the method, a compact drafter drafts among its own tokens, or the most used of
them when ``draft_vocab_size`` narrows it further."""

from __future__ import annotations

import json

import pytest
import torch
from redrafter_tiny import fitted_drafter
from safetensors.torch import load_file, save_file

from specdec import LLM, ConfigError, ModelLoadError, SamplingParams
from specdec.draft_vocab import load_ranking
from specdec.testing.conformance import fixed_draft_len, recorded_proposals
from specdec.testing.tiny import make_tiny_target, shuffled_ranking
from specdec_redrafter import DrafterSpec, RecurrentDrafter, load_drafter, save_drafter
from specdec_redrafter.drafter import ReDrafterResources

H, V, KEPT = 8, 50, 20


def _compact(seed: int = 0) -> RecurrentDrafter:
    torch.manual_seed(seed)
    full = RecurrentDrafter(DrafterSpec(H, V, 12, 2, True))
    for p in full.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    return full.narrowed(torch.randperm(V)[:KEPT])


def test_export_narrowed_to_the_vocabulary_drafts_as_the_compact_drafter() -> None:
    compact = _compact()
    assert compact.output.weight.shape == (KEPT, 12) and compact.output.weight.requires_grad
    full = compact.export()
    assert full.output.weight.shape == (V, 12) and full.token_ids is None
    outside = torch.ones(V, dtype=torch.bool)
    outside[compact.token_ids] = False
    assert not full.output.weight[outside].any()
    full.narrow_vocabulary(compact.token_ids)
    hidden, state = torch.randn(5, H), torch.zeros(5, H)
    with torch.no_grad():
        for _ in range(3):
            state = compact.advance(state, torch.randn(5, H))
            assert torch.equal(compact.logits(hidden, state), full.logits(hidden, state))


def test_compact_checkpoint_round_trips(tmp_path) -> None:
    """Saved compact (its rows and token ids), the drafter loads as the same compact drafter; bad
    token ids, size or a stray ``token_ids`` are one-line errors naming the field."""
    compact = _compact()
    directory = save_drafter(compact, tmp_path / "compact")
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(directory / "model.safetensors"))
    assert config["draft_vocab_size"] == KEPT and config["vocab_size"] == V
    assert tensors["lm_head.2.weight"].shape == (KEPT, 12) and tensors["token_ids"].tolist() == compact.token_ids.tolist()
    loaded = load_drafter(directory, H, V)
    assert torch.equal(loaded.token_ids, compact.token_ids)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), compact.state_dict().values()))
    full = save_drafter(compact.export(), tmp_path / "full")
    assert "draft_vocab_size" not in json.loads((full / "config.json").read_text())
    assert "token_ids" not in load_file(str(full / "model.safetensors"))

    save_file({**tensors, "token_ids": tensors["token_ids"].flip(0).contiguous()}, str(directory / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=rf"^token_ids: must be {KEPT} ascending token ids below {V}"):
        load_drafter(directory, H, V)
    (directory / "config.json").write_text(json.dumps({**config, "draft_vocab_size": V}))
    with pytest.raises(ConfigError, match=r"^draft_vocab_size: must be an integer from 0 to below vocab_size"):
        load_drafter(directory, H, V)
    save_file({**load_file(str(full / "model.safetensors")), "token_ids": tensors["token_ids"]},
              str(full / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"^token_ids: in the drafter's weights in .*, but its config sets no "):
        load_drafter(full, H, V)


def test_a_compact_drafter_drafts_among_its_own_tokens(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without options the beams use the compact drafter's tokens, exactly as its full export
    narrowed to them does; ``draft_vocab_size`` keeps the best ranked of them only."""
    target = make_tiny_target(seed=0)
    vocab = target.model.config.vocab_size
    ranking = shuffled_ranking(vocab, tmp_path / "ranking.safetensors")
    ranked = load_ranking(ranking, vocab)
    compact = fitted_drafter(target.model).narrowed(ranked[:20])
    paths = {"compact": save_drafter(compact, tmp_path / "compact"), "full": save_drafter(compact.export(), tmp_path / "full")}
    seen = recorded_proposals(monkeypatch, ReDrafterResources)
    prompts = [{"prompt_token_ids": target.encode("hello world")}, {"prompt_token_ids": target.encode("the cat")}]
    drafted = {}
    for name, path, options in (("compact", "compact", {}), ("full", "full", {"draft_vocab": str(ranking), "draft_vocab_size": 20}),
                                ("narrower", "compact", {"draft_vocab": str(ranking), "draft_vocab_size": 12})):
        seen.clear()
        config = fixed_draft_len({"method": "redrafter", "speculative_model": str(paths[path]), "redrafter_num_beams": 4,
                                  "max_draft_len": 3, **options})
        with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
            llm.generate(prompts, SamplingParams(max_tokens=16))
        drafted[name] = [(p.token_ids, p.parents) for _, p in seen]
    assert any(tokens for tokens, _ in drafted["compact"])
    assert drafted["compact"] == drafted["full"]
    assert all(t in set(ranked[:20].tolist()) for tokens, _ in drafted["compact"] for t in tokens)
    assert all(t in set(ranked[:12].tolist()) for tokens, _ in drafted["narrower"] for t in tokens)
    assert drafted["narrower"] != drafted["compact"]
