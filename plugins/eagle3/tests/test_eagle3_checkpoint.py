"""Heads load from and save to the SafeAILab and vLLM speculators layouts; broken checkpoints fail clearly."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from eagle3_tiny import head_config
from safetensors.torch import load_file, save_file

from specdec.errors import ConfigError, ModelLoadError
from specdec.testing import make_tiny_target
from specdec_eagle3 import Eagle3Head, load_head, save_head

SAFEAILAB_TENSORS = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}
SPECULATORS_TENSORS = {n.replace("midlayer.", "layers.0.") for n in SAFEAILAB_TENSORS}


@pytest.fixture(scope="module")
def head() -> Eagle3Head:
    target = make_tiny_target(seed=2)
    torch.manual_seed(4)
    head = Eagle3Head(head_config(target.model, (0, 1, 2), draft_vocab_size=16))
    vocab = torch.arange(0, 32, 2)
    with torch.no_grad():
        head.d2t.copy_(vocab - torch.arange(16))
        head.t2d.zero_()
        head.t2d[vocab] = True
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norms away from 1, so a dropped tensor would show
    return head.eval()


def _same(a: Eagle3Head, b: Eagle3Head) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert a.config.layers_to_capture == b.config.layers_to_capture
    assert (a.config.draft_vocab_size, a.config.vocab_size, a.config.hidden_size) == (
        b.config.draft_vocab_size,
        b.config.vocab_size,
        b.config.hidden_size,
    )


@pytest.mark.parametrize("weights_format", ["safetensors", "bin"])
def test_safeailab_layout_round_trip(head: Eagle3Head, tmp_path: Path, weights_format: str) -> None:
    """Saved with SafeAILab's names and config fields, loaded back bit for bit."""
    path = save_head(head, tmp_path / "h", "safeailab", weights_format=weights_format)
    file = path / ("model.safetensors" if weights_format == "safetensors" else "pytorch_model.bin")
    names = set(load_file(str(file)) if weights_format == "safetensors" else torch.load(file, weights_only=True))
    assert names == SAFEAILAB_TENSORS
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 16
    assert config["vocab_size"] == head.config.vocab_size and "rope_theta" in config
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    _same(head, load_head(path))


def test_speculators_layout_round_trip(head: Eagle3Head, tmp_path: Path) -> None:
    """Saved with speculators' ``layers.0.`` names and config, loaded back bit for bit."""
    path = save_head(head, tmp_path / "h", "speculators", verifier="org/target", speculative_tokens=5)
    assert set(load_file(str(path / "model.safetensors"))) == SPECULATORS_TENSORS
    config = json.loads((path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    _same(head, load_head(path))


def test_multi_layer_heads_use_the_speculators_layout(tmp_path: Path) -> None:
    """A three-layer head saves as speculators' ``layers.0-2.`` with ``num_hidden_layers: 3`` (as vLLM
    reads it) and loads back bit for bit; the SafeAILab layout, one layer by definition, refuses it."""
    target = make_tiny_target(seed=2)
    torch.manual_seed(5)
    deep = Eagle3Head(head_config(target.model, (0, 1, 2), draft_vocab_size=target.model.config.vocab_size, num_layers=3))
    path = save_head(deep, tmp_path / "h", "speculators")
    later = {n.replace("layers.0.", f"layers.{i}.") for i in (1, 2) for n in SPECULATORS_TENSORS
             if n.startswith("layers.0.") and "hidden_norm" not in n}
    assert set(load_file(str(path / "model.safetensors"))) == SPECULATORS_TENSORS | later
    assert json.loads((path / "config.json").read_text())["transformer_layer_config"]["num_hidden_layers"] == 3
    loaded = load_head(path)
    assert loaded.config.num_layers == 3
    _same(deep, loaded)
    with pytest.raises(ConfigError, match="SafeAILab layout holds one decoder layer; this head has 3"):
        save_head(deep, tmp_path / "s", "safeailab")


def test_safeailab_heads_have_one_layer_whatever_the_config_says(head: Eagle3Head, tmp_path: Path) -> None:
    """The authors' code builds one midlayer regardless of ``num_hidden_layers`` (EAGLE3-Vicuna1.3-13B's
    config says 40), so such a checkpoint loads as the one-layer head it is."""
    path = _broken(head, tmp_path, edit_config=_cfg("num_hidden_layers", 40))
    loaded = load_head(path)
    assert loaded.config.num_layers == 1
    _same(head, loaded)


def test_speculators_extras_are_understood(head: Eagle3Head, tmp_path: Path) -> None:
    """An ``embed_tokens.weight`` of its own is used; speculators' verifier copies are ignored."""
    path = save_head(head, tmp_path / "h", "speculators")
    tensors = load_file(str(path / "model.safetensors"))
    embedding = torch.randn(head.config.vocab_size, head.config.hidden_size)
    tensors.update({"embed_tokens.weight": embedding, "verifier_norm.weight": torch.ones(head.config.hidden_size)})
    save_file(tensors, str(path / "model.safetensors"))
    loaded = load_head(path)
    assert torch.equal(loaded.embed_tokens.weight, embedding)


def test_full_vocabulary_head_may_omit_vocab_maps(head: Eagle3Head, tmp_path: Path) -> None:
    """Without d2t/t2d a head over the whole target vocabulary maps draft id i to target id i."""
    config = head_config(make_tiny_target(seed=2).model, None, draft_vocab_size=head.config.vocab_size)
    full = Eagle3Head(config)
    path = save_head(full, tmp_path / "h")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["d2t"], tensors["t2d"]
    save_file(tensors, str(path / "model.safetensors"))
    loaded = load_head(path)
    assert torch.equal(loaded.draft_to_target(), torch.arange(head.config.vocab_size))
    assert bool(loaded.t2d.all())


def _broken(head: Eagle3Head, tmp_path: Path, edit_tensors=None, edit_config=None, layout: str = "safeailab") -> Path:
    path = save_head(head, tmp_path / "broken", layout)
    if edit_tensors:
        tensors = load_file(str(path / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(path / "model.safetensors"))
    if edit_config:
        config = json.loads((path / "config.json").read_text())
        edit_config(config)
        (path / "config.json").write_text(json.dumps(config))
    return path


def _drop(name):
    return lambda tensors: tensors.pop(name)


def _set(name, value):
    return lambda tensors: tensors.__setitem__(name, value)


def _cfg(key, value):
    return lambda config: config.__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit_tensors", "edit_config", "message"),
    [
        (_drop("midlayer.hidden_norm.weight"), None, "missing tensor 'midlayer.hidden_norm.weight'"),
        (_drop("d2t"), None, "missing tensor 'd2t'"),
        (lambda t: [t.pop(n) for n in ("norm.weight", "fc.weight")], None, r"missing tensor 'fc.weight' \(and 1 more\)"),
        (_set("fc.weight", torch.zeros(64, 128)), None, r"tensor 'fc.weight' has shape \[64, 128\] but config.json implies \[64, 192\]"),
        (_set("lm_head.weight", torch.zeros(30, 64)), None, r"'lm_head.weight' has shape \[30, 64\]"),
        (_set("midlayer.self_attn.q_proj.weight", torch.zeros(64, 64)), None, "q_proj.weight' has shape"),
        (_set("layers.1.mlp.up_proj.weight", torch.zeros(2)), None, "unexpected tensor 'layers.1.mlp.up_proj.weight'"),
        (_set("d2t", torch.full((16,), 1000)), None, "d2t maps draft ids outside the target vocabulary"),
        (_set("d2t", torch.zeros(16, dtype=torch.long).index_fill_(0, torch.tensor([1]), -1)), None, "two draft ids to the same"),
        (None, _cfg("hidden_size", None), "lacks the integer field 'hidden_size'"),
        (None, _cfg("hidden_size", 32), "has shape"),
    ],
)
def test_bad_safeailab_checkpoints_fail_clearly(head, tmp_path, edit_tensors, edit_config, message) -> None:
    """Each defect is one ModelLoadError naming the checkpoint and the tensor or field."""
    path = _broken(head, tmp_path, edit_tensors, edit_config)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_head(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_speculators_checkpoints_fail_clearly(head: Eagle3Head, tmp_path: Path) -> None:
    """A speculators config of another algorithm, or without its layer config, is refused by name."""
    path = _broken(head, tmp_path, edit_config=_cfg("speculators_model_type", "eagle"), layout="speculators")
    with pytest.raises(ModelLoadError, match="speculators_model_type is 'eagle', not 'eagle3'"):
        load_head(path)
    path = _broken(head, tmp_path, edit_config=lambda c: c.pop("transformer_layer_config"), layout="speculators")
    with pytest.raises(ModelLoadError, match="no transformer_layer_config"):
        load_head(path)
    path = _broken(head, tmp_path, edit_config=lambda c: c["transformer_layer_config"].update(num_hidden_layers=2),
                   layout="speculators")
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers is 2 but the checkpoint holds tensors of 1 decoder layer \(layers\.0-0\)"):
        load_head(path)
    path = _broken(head, tmp_path, edit_config=lambda c: c["transformer_layer_config"].update(num_hidden_layers=0),
                   layout="speculators")
    with pytest.raises(ModelLoadError, match="num_hidden_layers must be a positive integer, got 0"):
        load_head(path)


def test_missing_or_unreadable_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_head(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_head(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json is unreadable"):
        load_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 36}))
    with pytest.raises(ModelLoadError, match="no model.safetensors or pytorch_model.bin"):
        load_head(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        load_head(tmp_path)


def test_eagle1_checkpoint_is_refused(tmp_path: Path) -> None:
    """EAGLE-1/2 heads (``layers.0.*``, fc over two states, no hidden_norm) are named as such."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 36, "num_hidden_layers": 1}))
    save_file({"fc.weight": torch.zeros(64, 128), "layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="an EAGLE-1/2 head, not EAGLE-3"):
        load_head(tmp_path)


# -- config.json checked before anything is allocated ---------------------------------------------


@pytest.fixture
def largest_allocation(monkeypatch) -> list[int]:
    """The most elements any ``torch.empty`` (what ``nn.Linear`` allocates its weight with) has
    asked for off the meta device since the test began."""
    largest = [0]
    empty = torch.empty
    # torch's device context lists the factory functions it redirects once, at its first use:
    # listed while the spy stands in for torch.empty, the real one would allocate on the CPU.
    with torch.device("meta"):
        empty(0)

    def spy(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        if not tensor.is_meta:
            largest[0] = max(largest[0], tensor.numel())
        return tensor

    monkeypatch.setattr(torch, "empty", spy)
    return largest


def test_huge_intermediate_size_fails_fast_without_allocating(head, tmp_path, largest_allocation) -> None:
    """``intermediate_size: 4000000000`` (a 1 TB MLP) is refused at once, naming the field and the
    tensor whose shape disagrees, and nothing near that size is allocated."""
    path = _broken(head, tmp_path, edit_config=_cfg("intermediate_size", 4_000_000_000))
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"'midlayer.mlp.gate_proj.weight' has shape \[128, 64\] but config.json "
                                             r"implies \[4000000000, 64\] \(hidden_size 64, intermediate_size 4000000000\)"):
        load_head(path)
    assert time.perf_counter() - start < 2.0
    assert largest_allocation[0] <= 64 * 192, "load_head allocated a head-sized tensor before refusing the config"


def test_head_for_another_target_is_refused_before_allocating(head, tmp_path, largest_allocation) -> None:
    """Given the target's sizes, a head for another target is refused before its weights exist."""
    path = save_head(head, tmp_path / "h")
    with pytest.raises(ModelLoadError, match="fc reads target states of width 64, but the target's hidden_size is 32"):
        load_head(path, target_hidden_size=32, target_vocab_size=head.config.vocab_size)
    with pytest.raises(ModelLoadError, match="vocab_size 36 differs from the target's 50 tokens"):
        load_head(path, target_hidden_size=64, target_vocab_size=50)
    assert largest_allocation[0] == 0
    loaded = load_head(path, target_hidden_size=64, target_vocab_size=head.config.vocab_size)
    _same(head, loaded)


def _layer_cfg(key, value):
    return lambda config: config["transformer_layer_config"].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit_config", "layout", "message"),
    [
        (_cfg("intermediate_size", 4e9), "safeailab", r"intermediate_size must be a positive integer, got 4000000000\.0"),
        (_cfg("hidden_size", "64"), "safeailab", "hidden_size must be a positive integer, got '64'"),
        (_cfg("num_attention_heads", 0), "safeailab", "num_attention_heads must be a positive integer, got 0"),
        (_cfg("num_key_value_heads", True), "safeailab", "num_key_value_heads must be a positive integer, got True"),
        (_cfg("head_dim", -16), "safeailab", "head_dim must be a positive integer, got -16"),
        (_cfg("target_hidden_size", 64.5), "safeailab", r"target_hidden_size must be a positive integer, got 64\.5"),
        (_cfg("draft_vocab_size", 37), "safeailab", r"draft_vocab_size 37 exceeds the target vocabulary \(vocab_size 36\)"),
        (_cfg("vocab_size", 1 << 40), "safeailab", f"vocab_size {1 << 40} is not a real vocabulary"),
        (_cfg("num_key_value_heads", 3), "safeailab", "num_key_value_heads 3 does not divide num_attention_heads 4"),
        (lambda c: c.update(num_attention_heads=5, num_key_value_heads=5, head_dim=None), "safeailab",
         r"num_attention_heads 5 does not divide hidden_size 64 \(and no head_dim\)"),
        (_cfg("rms_norm_eps", "small"), "safeailab", "not a valid Llama config: .*rms_norm_eps"),
        (_layer_cfg("intermediate_size", 4_000_000_000), "speculators",
         r"'layers.0.mlp.gate_proj.weight' has shape .* \(hidden_size 64, intermediate_size 4000000000\)"),
        (_layer_cfg("num_key_value_heads", 0), "speculators",
         "transformer_layer_config.num_key_value_heads must be a positive integer, got 0"),
        (_layer_cfg("num_hidden_layers", 1000), "speculators", "num_hidden_layers is 1000 but the checkpoint holds"),
        (_layer_cfg("head_dim", 4096), "speculators",
         r"'layers.0.self_attn.q_proj.weight' has shape \[64, 128\] but config.json implies \[16384, 128\] "
         r"\(hidden_size 64, num_attention_heads 4, num_key_value_heads 2, head_dim 4096\)"),
    ],
)
def test_bad_config_fields_are_named_before_allocating(head, tmp_path, largest_allocation, edit_config, layout, message) -> None:
    """Each bad size field in config.json is one ModelLoadError naming it, raised quickly and
    before the head's weights are allocated."""
    path = _broken(head, tmp_path, edit_config=edit_config, layout=layout)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=message) as info:
        load_head(path)
    assert time.perf_counter() - start < 2.0
    assert largest_allocation[0] == 0
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("layout", "name", "shown", "value"),
    [
        ("safeailab", "midlayer.mlp.down_proj.weight", "midlayer.mlp.down_proj.weight", float("nan")),
        ("speculators", "midlayer.self_attn.k_proj.weight", "layers.0.self_attn.k_proj.weight", float("inf")),
        ("safeailab", "norm.weight", "norm.weight", float("-inf")),
    ],
)
def test_non_finite_weights_name_the_tensor(head, tmp_path, layout, name, shown, value) -> None:
    """A NaN or infinite weight is refused naming the tensor as the checkpoint spells it."""
    path = save_head(head, tmp_path / "h", layout)
    file = str(path / "model.safetensors")
    tensors = load_file(file)
    stored = name if layout == "safeailab" else name.replace("midlayer.", "layers.0.")
    tensors[stored].view(-1)[[0, 5]] = value
    save_file(tensors, file)
    with pytest.raises(ModelLoadError, match=rf"tensor '{re.escape(shown)}' holds 2 NaN or infinite value\(s\)"):
        load_head(path)
