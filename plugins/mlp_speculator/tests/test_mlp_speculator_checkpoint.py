"""IBM's MLP speculator layout loads as published: tied stages stored once, the ``speculator.``
prefix, ``inner_dim`` 0; the stages compute IBM's equations (checked against a reference written
from them here); unknown or inconsistent fields are one-line errors naming the field."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from specdec import LLM, ConfigError, ModelLoadError
from specdec_mlp_speculator import load_speculator

EMB, INNER, VOCAB, N = 16, 24, 40, 3


def _tensors(tie: bool, generator: torch.Generator, inner: int = INNER) -> dict[str, torch.Tensor]:
    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.3

    tensors = {}
    for i in range(1 if tie else N):
        tensors[f"emb.{i}.weight"] = rand(VOCAB, inner)
        tensors[f"head.{i}.weight"] = rand(VOCAB, inner)
        tensors[f"ln.{i}.weight"] = 1 + rand(inner)
        tensors[f"ln.{i}.bias"] = rand(inner)
    for i in range(2 if tie else N):
        tensors[f"proj.{i}.weight"] = rand(inner, EMB if i == 0 else inner)
    return tensors


def _write(directory, tensors, **config) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    fields = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "emb_dim": EMB,
              "inner_dim": INNER, "n_predict": N, "vocab_size": VOCAB, "n_candidates": 4, "tie_weights": False,
              "scale_input": True, "top_k_tokens_per_head": [3, 2, 2], "torch_dtype": "float16",
              "transformers_version": "4.38.2", **config}
    (directory / "config.json").write_text(json.dumps(fields))
    save_file({f"speculator.{k}": v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    return str(directory)


def _reference_chain(tensors, tie, hidden, token, scale_input=True) -> list[int]:
    """Greedy drafts by IBM's own form: ``state * state_weight + emb * emb_weight``, normed."""
    state_weight = 0.5 ** (0.5 / N)
    emb_weight = math.sqrt((1 - state_weight**2) * INNER / 2)

    def norm(x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    state = norm(hidden) / math.sqrt(2) if scale_input else hidden
    drafts = []
    for i in range(N):
        s = "0" if tie else str(i)
        p = ("1" if i else "0") if tie else str(i)
        state = tensors[f"proj.{p}.weight"] @ state * state_weight + tensors[f"emb.{s}.weight"][token] * emb_weight
        state = torch.nn.functional.gelu(tensors[f"ln.{s}.weight"] * norm(state) + tensors[f"ln.{s}.bias"])
        token = int((tensors[f"head.{s}.weight"] @ state).argmax())
        drafts.append(token)
    return drafts


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_published_layout_computes_ibms_equations(tmp_path, tie):
    generator = torch.Generator().manual_seed(0)
    tensors = _tensors(tie, generator)
    model = load_speculator(_write(tmp_path / "s", tensors, tie_weights=tie), EMB, VOCAB)
    hidden = torch.randn(EMB, generator=generator)
    with torch.no_grad():
        for token in (3, 17, 29):
            state, drafts = model.first_state(hidden[None]), []
            last = torch.tensor([token])
            for i in range(N):
                state, logits = model.step(i, state, last)
                last = logits.argmax(-1)
                drafts.append(int(last))
            assert drafts == _reference_chain(tensors, tie, hidden, token)


def test_inner_dim_zero_means_the_hidden_size(tmp_path):
    tensors = _tensors(False, torch.Generator().manual_seed(1), inner=EMB)
    model = load_speculator(_write(tmp_path / "s", tensors, inner_dim=0), EMB, VOCAB)
    assert model.spec.inner_dim == EMB


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_layers": 2}, r"^n_layers: unknown field in .*config\.json"),
        ({"model_type": "medusa"}, r"^model_type: 'medusa' .* 'mlp_speculator'"),
        ({"emb_dim": 32}, r"^emb_dim: the speculator reads hidden states of 32, the target's are 16"),
        ({"vocab_size": 41}, r"^vocab_size: the speculator's is 41, the target's 40"),
        ({"top_k_tokens_per_head": [2, 2]}, r"^top_k_tokens_per_head: 2 entries for n_predict 3"),
        ({"tie_weights": "yes"}, r"^tie_weights: must be true or false"),
    ],
)
def test_bad_fields_are_named(tmp_path, change, message):
    directory = _write(tmp_path / "s", _tensors(False, torch.Generator().manual_seed(0)), **change)
    with pytest.raises(ConfigError, match=message):
        load_speculator(directory, EMB, VOCAB)


def test_missing_and_misshapen_tensors_are_named(tmp_path):
    tensors = _tensors(False, torch.Generator().manual_seed(0))
    del tensors["head.2.weight"]
    with pytest.raises(ModelLoadError, match=r"^head\.2\.weight: missing"):
        load_speculator(_write(tmp_path / "a", tensors), EMB, VOCAB)
    tensors = _tensors(False, torch.Generator().manual_seed(0))
    tensors["proj.1.weight"] = tensors["proj.1.weight"][:, :-1]
    with pytest.raises(ModelLoadError, match=r"^proj\.1\.weight: shape \[24, 23\] .* expected \[24, 24\]"):
        load_speculator(_write(tmp_path / "b", tensors), EMB, VOCAB)


def test_more_drafts_than_stages_and_no_model_are_config_errors(tiny, tmp_path):
    from mlp_tiny import fitted_speculator

    from specdec_mlp_speculator import save_speculator

    directory = save_speculator(fitted_speculator(tiny.model, steps=1), tmp_path / "s")
    with pytest.raises(ConfigError, match=r"^num_speculative_tokens: 4 exceeds the speculator's n_predict \(3 stages\)"):
        LLM(tiny.model, {"method": "mlp_speculator", "model": str(directory), "num_speculative_tokens": 4},
            tokenizer=tiny.tokenizer)
    with pytest.raises(ConfigError, match=r"^speculative_model: required"):
        LLM(tiny.model, {"method": "mlp_speculator"}, tokenizer=tiny.tokenizer)
