"""Reading MTP layers in DeepSeek-V3's layout: one file or shards, shared or own embeddings, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mtp_tiny import initialized, save_with_mtp
from safetensors.torch import load_file, save_file

from specdec import LLM
from specdec.errors import ConfigError, ModelLoadError
from specdec.testing.architectures import make_tiny_model
from specdec_mtp import MTPLayer, load_mtp_layers, mtp_layer_tensors


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(2)
    target = make_tiny_model("deepseek_v3")
    first = target.model.config.num_hidden_layers
    return target, [initialized(MTPLayer(target.model.config, first + i)) for i in range(2)]


def _same(a: MTPLayer, b: MTPLayer) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("sharded", [False, True])
def test_layers_round_trip_in_the_published_layout(tiny, tmp_path: Path, sharded: bool) -> None:
    target, layers = tiny
    save_with_mtp(target, layers, tmp_path, sharded=sharded)
    names = load_file(next(tmp_path.glob("*.safetensors")) if not sharded else tmp_path / "model-00002-of-00002.safetensors")
    assert "model.layers.2.eh_proj.weight" in names and "model.layers.3.mlp.experts.0.gate_proj.weight" in names
    assert "model.layers.2.self_attn.q_a_proj.weight" in names and "model.layers.2.shared_head.head.weight" in names
    loaded = load_mtp_layers(tmp_path, target.model.config, 2)
    assert all(_same(a, b) for a, b in zip(layers, loaded))
    assert all(layer.embed_tokens is None for layer in loaded)


def _rewrite(directory: Path, change) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_own_embedding_is_loaded(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers[:1], tmp_path, sharded=False)
    embedding = torch.randn_like(target.model.get_input_embeddings().weight)
    _rewrite(tmp_path, lambda t: t.update({"model.layers.2.embed_tokens.weight": embedding}))
    (layer,) = load_mtp_layers(tmp_path, target.model.config, 1)
    assert torch.equal(layer.embed_tokens.weight, embedding)


def test_missing_tensor_is_named(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers, tmp_path, sharded=False)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.3.hnorm.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor model\.layers\.3\.hnorm\.weight"):
        load_mtp_layers(tmp_path, target.model.config, 2)


def test_missing_expert_is_named(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers[:1], tmp_path, sharded=False)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.2.mlp.experts.1.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor model\.layers\.2\.mlp\.experts\.1\.up_proj\.weight"):
        load_mtp_layers(tmp_path, target.model.config, 1)


def test_misshapen_tensor_is_named(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers[:1], tmp_path, sharded=False)
    _rewrite(tmp_path, lambda t: t.update({"model.layers.2.eh_proj.weight": torch.zeros(32, 32)}))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.2\.eh_proj\.weight has shape \[32, 32\], expected \[32, 64\]"):
        load_mtp_layers(tmp_path, target.model.config, 1)


def test_more_layers_than_the_checkpoint_holds(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers[:1], tmp_path, sharded=False)
    with pytest.raises(ModelLoadError, match=r"missing tensor model\.layers\.3\.enorm\.weight"):
        load_mtp_layers(tmp_path, target.model.config, 2)


def test_target_not_from_a_directory_needs_speculative_model(tiny) -> None:
    target, _ = tiny
    with pytest.raises(ConfigError, match="speculative_model"):
        LLM(target.model, {"method": "mtp"}, tokenizer=target.tokenizer)


def test_speculative_model_names_the_directory(tiny, tmp_path: Path) -> None:
    target, layers = tiny
    save_with_mtp(target, layers[:1], tmp_path, sharded=False)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    llm = LLM(target.model, {"method": "mtp", "speculative_model": str(tmp_path)}, tokenizer=target.tokenizer)
    llm.close()


@pytest.mark.parametrize(("architecture", "message"), [
    ("gpt2", "no decoder-layer class for model_type 'gpt2'"),
    ("gemma3", "model_type 'gemma3_text' is not supported yet"),
])
def test_a_target_mtp_blocks_cannot_be_built_for_is_refused(tmp_path: Path, architecture: str, message: str) -> None:
    """Refused when the LLM is built, with one error naming the model type, not mid-drafting."""
    target = make_tiny_model(architecture)
    with pytest.raises(ModelLoadError, match=message):
        LLM(target.model, {"method": "mtp", "speculative_model": str(tmp_path)}, tokenizer=target.tokenizer)


def test_llama_layer_is_a_llama_block_under_deepseeks_names(tmp_path: Path) -> None:
    """A Llama target's MTP layer: the target's own decoder-layer class (grouped-query keys and
    values), its tensors under the block's own names beside DeepSeek's enorm/hnorm/eh_proj/shared_head."""
    target = make_tiny_model("llama")
    config = target.model.config
    layer = initialized(MTPLayer(config, 2))
    assert type(layer.block).__name__ == "LlamaDecoderLayer" and type(layer.enorm).__name__ == "LlamaRMSNorm"
    names = set(mtp_layer_tensors(layer, 2))
    own = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
           "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
           "post_attention_layernorm.weight")
    assert names == {f"model.layers.2.{n}" for n in own}
    save_with_mtp(target, [layer], tmp_path, sharded=False)
    assert _same(load_mtp_layers(tmp_path, config, 1)[0], layer)
