"""Heads load from both published layouts and compute what was saved; a checkpoint that does
not fit the target is an error naming the tensor or the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from medusa_tiny import fasterdecoding_tensors, save_fasterdecoding, save_vllm
from safetensors.torch import load_file, save_file

from specdec import LLM
from specdec.errors import ConfigError, ModelLoadError
from specdec.testing import make_tiny_target
from specdec_medusa import MedusaHeads, load_heads

HIDDEN, VOCAB = 16, 40


@pytest.fixture
def heads() -> MedusaHeads:
    torch.manual_seed(0)
    heads = MedusaHeads(3, 2, HIDDEN, VOCAB)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return heads.eval()


def _same_outputs(a: MedusaHeads, b: MedusaHeads, vocab: int = VOCAB) -> None:
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(a.full_logits(a(x), vocab), b.full_logits(b(x), vocab))


@pytest.mark.parametrize("weights_format", ["safetensors", "pt"])
def test_fasterdecoding_layout_loads(heads: MedusaHeads, tmp_path: Path, weights_format: str) -> None:
    """Blocks ``{i}.{j}.linear.*`` and head ``{i}.{num_layers}.weight``, from either file."""
    assert {"2.1.linear.bias", "2.2.weight"} <= set(fasterdecoding_tensors(heads))
    directory = save_fasterdecoding(heads, tmp_path, weights_format)
    assert (directory / f"medusa_lm_head.{weights_format}").is_file()
    _same_outputs(load_heads(directory, HIDDEN, VOCAB), heads)


def test_vllm_layout_loads(heads: MedusaHeads, tmp_path: Path) -> None:
    _same_outputs(load_heads(save_vllm(heads, tmp_path), HIDDEN, VOCAB), heads)


def test_vllm_truncated_vocabulary_maps_to_target_ids(heads: MedusaHeads, tmp_path: Path) -> None:
    token_map = torch.tensor([3, 7, 8, 20, 39])
    loaded = load_heads(save_vllm(heads, tmp_path, token_map=token_map), HIDDEN, VOCAB)
    x = torch.randn(2, HIDDEN)
    with torch.no_grad():
        full = loaded.full_logits(loaded(x), VOCAB)
        torch.testing.assert_close(full[..., token_map], heads(x)[..., token_map])
    assert torch.isinf(full[..., 0]).all()
    assert loaded.target_ids(torch.tensor([0, 4])).tolist() == [3, 39]


def test_vllm_bias_free_blocks_and_shared_lm_head(heads: MedusaHeads, tmp_path: Path) -> None:
    """vLLM's defaults: no block bias (medusa_fc_bias false); original_lm_head shares lm_heads.0."""
    directory = save_vllm(heads, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "medusa_fc_bias": False, "original_lm_head": True}))
    tensors = {k: v for k, v in load_file(str(directory / "model.safetensors")).items()
               if not k.endswith(".bias") and not k.startswith(("lm_heads.1", "lm_heads.2"))}
    save_file({f"medusa_heads.{k}": v for k, v in tensors.items()}, str(directory / "model.safetensors"))
    loaded = load_heads(directory, HIDDEN, VOCAB)
    assert loaded.blocks[0][0].linear.bias is None
    assert all(torch.equal(h.weight, heads.lm_heads[0].weight) for h in loaded.lm_heads)


def test_num_heads_loads_the_first_heads(heads: MedusaHeads, tmp_path: Path) -> None:
    loaded = load_heads(save_fasterdecoding(heads, tmp_path), HIDDEN, VOCAB, num_heads=2)
    assert loaded.num_heads == 2
    with pytest.raises(ConfigError, match="num_medusa_heads: 4 requested.*has 3 heads"):
        load_heads(tmp_path, HIDDEN, VOCAB, num_heads=4)


def _drop(directory: Path, name: str) -> None:
    file = directory / "medusa_lm_head.safetensors"
    tensors = load_file(str(file))
    del tensors[name]
    save_file(tensors, str(file))


def test_errors_name_the_tensor_or_field(heads: MedusaHeads, tmp_path: Path) -> None:
    directory = save_fasterdecoding(heads, tmp_path / "fd")
    with pytest.raises(ModelLoadError, match=r"tensor '0.0.linear.weight' has shape \[16, 16\], expected \[32, 32\]"):
        load_heads(directory, 32, VOCAB)
    with pytest.raises(ModelLoadError, match=r"tensor '0.2.weight' has shape \[40, 16\], expected \[50, 16\].*vocabulary"):
        load_heads(directory, HIDDEN, 50)
    _drop(directory, "2.1.linear.bias")
    with pytest.raises(ModelLoadError, match="tensor '2.1.linear.bias' is missing"):
        load_heads(directory, HIDDEN, VOCAB)
    vllm = save_vllm(heads, tmp_path / "vllm")
    with pytest.raises(ModelLoadError, match="config.json: hidden_size is 16, the target's is 32"):
        load_heads(vllm, 32, VOCAB)
    (vllm / "config.json").write_text(json.dumps({"num_heads": 3, "hidden_size": HIDDEN, "vocab_size": VOCAB,
                                                  "num_hidden_layers": 2, "medusa_fc_bias": True,
                                                  "truncated_vocab_size": 5}))
    with pytest.raises(ModelLoadError, match="tensor 'token_map' is missing"):
        load_heads(vllm, HIDDEN, VOCAB)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_heads(tmp_path / "nowhere", HIDDEN, VOCAB)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    with pytest.raises(ModelLoadError, match="no weights file"):
        load_heads(tmp_path / "bad", HIDDEN, VOCAB)


def test_llm_reports_bad_checkpoint_and_too_deep_tree(tmp_path: Path) -> None:
    target = make_tiny_target(seed=0)
    with pytest.raises(ConfigError, match="speculative_model: required; a set of Medusa heads ships only for the default"):
        LLM(target.model, {"method": "medusa"}, tokenizer=target.tokenizer)
    hidden = target.model.config.hidden_size
    directory = save_fasterdecoding(MedusaHeads(2, 1, hidden, target.model.config.vocab_size), tmp_path)
    with pytest.raises(ConfigError, match="medusa_choices: paths 3 deep need 3 heads"):
        LLM(target.model, {"method": "medusa", "model": str(directory), "medusa_choices": [[0, 0, 0]]}, tokenizer=target.tokenizer)
    with LLM(target.model, {"method": "medusa", "model": str(directory)}, tokenizer=target.tokenizer) as llm:
        assert llm.engine.resource_manager.depth == 2
