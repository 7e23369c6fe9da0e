"""ReDrafter checkpoints load as Apple publishes them and as TensorRT-LLM's converter names them;
the drafter computes Apple's equations; inconsistent checkpoints are one-line errors naming the
field or tensor; beam search keeps the best-scoring beams, the tree shares their prefixes and a
node budget keeps the likeliest nodes."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from specdec import LLM, ConfigError, DraftTree, ModelLoadError
from specdec_redrafter import DrafterSpec, RecurrentDrafter, load_drafter, save_drafter
from specdec_redrafter.drafter import best_first_tree
from specdec_redrafter.drafter_model import beam_log_probs

H, V = 8, 11


def _random(rnn: bool = True, exit_dim: int = 2 * H, layers: int = 2, seed: int = 0) -> RecurrentDrafter:
    torch.manual_seed(seed)
    drafter = RecurrentDrafter(DrafterSpec(H, V, exit_dim, layers, rnn))
    for p in drafter.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    return drafter


def _reference_logits(tensors: dict[str, torch.Tensor], layers: int, rnn: bool, hidden: torch.Tensor,
                      embedded: list[torch.Tensor]) -> list[torch.Tensor]:
    """Apple's drafter written out from its tensors: state from 0, [h, s], blocks, output layer."""
    state, out = torch.zeros(H), []
    for e in embedded:
        if rnn:
            state = F.silu(e @ tensors["rnn_w.weight"].T + state @ tensors["rnn_u.weight"].T + tensors["rnn_u.bias"])
        else:
            state = state + e
        x = torch.cat([hidden, state])
        if "input_proj.weight" in tensors:
            x = x @ tensors["input_proj.weight"].T + tensors["input_proj.bias"]
        for i in range(layers):
            x = x + F.silu(x @ tensors[f"lm_head.{i}.linear.weight"].T + tensors[f"lm_head.{i}.linear.bias"])
        out.append(x @ tensors[f"lm_head.{layers}.weight"].T)
    return out


@pytest.mark.parametrize("rnn, exit_dim", [(True, 2 * H), (False, 12)], ids=["rnn", "sum-with-input-proj"])
def test_the_drafter_computes_apples_equations(tmp_path, rnn: bool, exit_dim: int) -> None:
    directory = save_drafter(_random(rnn, exit_dim), tmp_path / "drafter")
    tensors = load_file(directory / "model.safetensors")
    assert ("input_proj.weight" in tensors) == (exit_dim != 2 * H) and ("rnn_u.bias" in tensors) == rnn
    drafter = load_drafter(directory, H, V)
    hidden, embedded = torch.randn(H), [torch.randn(H) for _ in range(3)]
    expected = _reference_logits(tensors, 2, rnn, hidden, embedded)
    state = torch.zeros(H)
    with torch.no_grad():
        for e, want in zip(embedded, expected):
            state = drafter.advance(state, e)
            torch.testing.assert_close(drafter.logits(hidden, state), want)


def test_tensorrt_llm_names_and_mlx_extras_load_the_same_drafter(tmp_path) -> None:
    """The converter's names (``drafter.`` prefix, ``drafter.layers.{i}.linear``, ``drafter.lm_head``)
    and MLX's unused ``emb_norm`` (tensor and fields) give the same drafter as Apple's names."""
    apple = save_drafter(_random(), tmp_path / "apple")
    renamed = {}
    for name, tensor in load_file(apple / "model.safetensors").items():
        if name.startswith("lm_head.2."):
            name = "lm_head." + name.removeprefix("lm_head.2.")
        elif name.startswith("lm_head."):
            name = "layers." + name.removeprefix("lm_head.")
        renamed["drafter." + name] = tensor
    renamed["emb_norm.weight"] = torch.ones(H)
    converted = tmp_path / "converted"
    converted.mkdir()
    save_file(renamed, converted / "model.safetensors")
    config = json.loads((apple / "config.json").read_text())
    config.update(emb_norm=True, rms_norm_eps=1e-5, num_lookback_tokens=-1, _name_or_path="x")
    (converted / "config.json").write_text(json.dumps(config))
    a, b = load_drafter(apple, H, V), load_drafter(converted, H, V)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name


def _write(tmp_path, config_update=None, drop=None, reshape=None, extra=None):
    directory = save_drafter(_random(), tmp_path / "drafter")
    config = json.loads((directory / "config.json").read_text())
    config.update(config_update or {})
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(directory / "model.safetensors")
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = torch.zeros(3, 3)
    tensors.update(extra or {})
    save_file(tensors, directory / "model.safetensors")
    return directory


@pytest.mark.parametrize("kwargs, error, message", [
    ({"config_update": {"beam_width": 4}}, ConfigError, "^beam_width: unknown field"),
    ({"config_update": {"model_type": "medusa"}}, ConfigError, "^model_type: 'medusa'"),
    ({"config_update": {"exit_dim": 0}}, ConfigError, "^exit_dim: must be a positive integer"),
    ({"config_update": {"rnn": "yes"}}, ConfigError, "^rnn: must be true or false"),
    ({"config_update": {"redrafter_num_beams": -1}}, ConfigError, "^redrafter_num_beams: must be a non-negative integer"),
    ({"config_update": {"hidden_size": 16}}, ConfigError, "^hidden_size: the drafter reads hidden states of 16"),
    ({"config_update": {"vocab_size": 12}}, ConfigError, "^vocab_size: the drafter's is 12"),
    ({"drop": "rnn_w.weight"}, ModelLoadError, "^rnn_w.weight: missing"),
    ({"reshape": "lm_head.2.weight"}, ModelLoadError, r"^lm_head.2.weight: shape \[3, 3\]"),
    ({"extra": {"lm_head.3.weight": torch.zeros(V, 2 * H)}}, ModelLoadError, "^lm_head.3.weight: unexpected"),
])
def test_inconsistent_checkpoints_are_one_line_errors(tmp_path, kwargs, error, message) -> None:
    directory = _write(tmp_path, **kwargs)
    with pytest.raises(error, match=message) as raised:
        load_drafter(directory, H, V)
    assert "\n" not in str(raised.value)


def test_the_checkpoints_beam_search_is_the_default(tiny, tmp_path) -> None:
    """``redrafter_num_beams`` and ``redrafter_draft_len_per_beam`` in the drafter's config (as
    TensorRT-LLM's converted checkpoints carry them) set the beam search unless the options do."""
    config = tiny.model.config
    spec = DrafterSpec(config.hidden_size, config.vocab_size, 2 * config.hidden_size, 1, True,
                       redrafter_num_beams=3, redrafter_draft_len_per_beam=2)
    directory = save_drafter(RecurrentDrafter(spec), tmp_path / "drafter")
    saved = json.loads((directory / "config.json").read_text())
    assert saved["redrafter_num_beams"] == 3 and saved["redrafter_draft_len_per_beam"] == 2
    for options, expected in (({}, (3, 2)), ({"redrafter_num_beams": 5, "max_draft_len": 4}, (5, 4)),
                              ({"beam_width": 2}, (2, 2))):
        with LLM(tiny.model, {"method": "redrafter", "model": str(directory), **options}, tokenizer=tiny.tokenizer) as llm:
            resources = llm.engine.resource_manager
            assert (resources.num_beams, resources.depth) == expected, options


def test_a_missing_drafter_is_named_when_the_llm_is_built(tiny) -> None:
    with pytest.raises(ConfigError, match="^speculative_model: required"):
        LLM(tiny.model, {"method": "redrafter"}, tokenizer=tiny.tokenizer)


def test_beam_search_keeps_the_best_scoring_beams(tiny, tmp_path) -> None:
    """Against an exhaustive search over every 3-token continuation (the tiny vocabulary), the
    beams are the best by summed top-50 log-probabilities, in order, when the beams are as wide
    as the vocabulary (beam search is then exact); narrower beams come best first, and the tree
    shares the beams' common prefixes."""
    vocab, hidden_size = tiny.model.config.vocab_size, tiny.model.config.hidden_size
    torch.manual_seed(1)
    drafter = RecurrentDrafter(DrafterSpec(hidden_size, vocab, 2 * hidden_size, 1, True)).to(tiny.model.device)
    directory = save_drafter(drafter, tmp_path / "drafter")
    with LLM(tiny.model, {"method": "redrafter", "model": str(directory), "redrafter_num_beams": vocab,
                          "max_draft_len": 2}, tokenizer=tiny.tokenizer) as llm:
        resources = llm.engine.resource_manager
        hidden = torch.randn(1, hidden_size, device=tiny.model.device)
        last = torch.tensor([5], device=tiny.model.device)
        with torch.no_grad():
            found, found_scores = resources.beam_search(hidden, last, 2)
            beams = found[0].tolist()

            @torch.no_grad()
            def score(sequence):
                state, total, previous = torch.zeros_like(hidden[0]), 0.0, 5
                for token in sequence:
                    state = drafter.advance(state, tiny.model.get_input_embeddings()(torch.tensor(previous, device=hidden.device)))
                    total += float(beam_log_probs(drafter.logits(hidden[0], state))[token])
                    previous = token
                return total

            ranked = sorted(itertools.product(range(vocab), repeat=2), key=score, reverse=True)[:vocab]
        assert [score(b) for b in beams] == pytest.approx([score(list(s)) for s in ranked], abs=1e-4)
        assert found_scores[0].flatten().tolist() == pytest.approx([s for b in beams for s in (score(b[:1]), score(b))], abs=1e-4)
        resources.num_beams = 4
        with torch.no_grad():
            narrow = resources.beam_search(hidden, last, 2)[0][0].tolist()
        narrow_scores = [score(b) for b in narrow]
    assert narrow_scores == sorted(narrow_scores, reverse=True) and len({tuple(b) for b in narrow}) == 4
    tree = DraftTree()
    for beam in narrow:
        tree.add_chain(beam)
    assert len(tree) == len({tuple(b[:1]) for b in narrow}) + len({tuple(b) for b in narrow})


def test_the_tree_keeps_the_likeliest_nodes_first() -> None:
    """Beams sharing a prefix share its nodes; nodes come by prefix score, parents first, so a
    budget keeps the second beam's first draft before the first beam's third."""
    beams = [[1, 2, 3], [1, 4, 5], [6, 7, 8]]
    scores = [[-0.1, -0.5, -2.0], [-0.1, -0.9, -1.0], [-0.3, -3.0, -4.0]]
    whole = best_first_tree(beams, scores, 3, 10)
    assert whole.token_ids == [1, 6, 2, 4, 5, 3, 7, 8]
    assert whole.parents == [-1, -1, 0, 0, 3, 2, 1, 6]
    cut = best_first_tree(beams, scores, 3, 3)
    assert cut.token_ids == [1, 6, 2] and cut.parents == [-1, -1, 0]
    assert best_first_tree(beams, scores, 1, 10).token_ids == [1, 6]
