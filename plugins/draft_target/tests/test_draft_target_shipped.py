"""Training keeps the embedding frozen and ships only what it trained; the shipped tensors plus
the target's embedding assemble into a checkpoint that computes what the trained draft did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from specdec.errors import ConfigError
from specdec.training.synthesize import synthesize, SynthesisOptions
from specdec_draft_target.shipped import EMBEDDING, assemble_draft
from specdec_draft_target.train import build_draft, save as save_trained

from draft_target_helpers import save


@pytest.fixture(scope="module")
def tied_target(tmp_path_factory: pytest.TempPathFactory):
    """A tiny target with a tied embedding and output layer, like SmolLM2."""
    from specdec.testing import make_tiny_target

    tiny = make_tiny_target(seed=3, num_layers=3)
    tiny.model.config.tie_word_embeddings = True
    model = type(tiny.model)(tiny.model.config).eval()
    return model, tiny.tokenizer, save(model, tiny.tokenizer, tmp_path_factory.mktemp("tied_target"))


def test_assembled_draft_equals_trained_draft(tied_target, tmp_path: Path) -> None:
    model, tokenizer, target_dir = tied_target
    draft = build_draft(model, [0, 2])
    with torch.no_grad():  # stand-in for training: move the trainable tensors
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    weights = tmp_path / "draft.safetensors"
    save_trained(draft, weights, [0, 2], steps=1, accuracy=0.5)
    with safe_open(str(weights), "pt") as f:
        names, meta = set(f.keys()), f.metadata()
        assert all(f.get_tensor(n).dtype == torch.bfloat16 for n in names)
    assert EMBEDDING not in names and "lm_head.weight" not in names
    assert meta["num_hidden_layers"] == "2" and meta["source_layers"] == "0,2"

    out = tmp_path / "assembled"
    assemble_draft(weights, target_dir, out)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.config.num_hidden_layers == 2
    assert torch.equal(loaded.get_output_embeddings().weight, model.get_input_embeddings().weight)
    with torch.no_grad():  # the shipped copy is the bf16-rounded trained draft
        for p in draft.parameters():
            if p.requires_grad:
                p.copy_(p.to(torch.bfloat16).float())
        ids = torch.tensor([tokenizer("the cat sat")["input_ids"]])
        torch.testing.assert_close(loaded(ids).logits, draft(ids).logits)


def test_train_command_writes_trained_tensors(tied_target, tmp_path: Path) -> None:
    """`specdec train draft` on synthesized tiny data: runs, reports progress, ships bf16 layers;
    `--init` continues those tensors (counting their steps) and refuses them for other layers;
    `--heldout-data` measures on conversations of its own and keeps them out of training, and
    `--heldout` keeps every copy of the conversations it draws out of training."""
    from click.testing import CliRunner

    from specdec_draft_target.train import train_draft

    model, tokenizer, target_dir = tied_target
    records = [{"conversation_id": str(i), "conversations": [{"role": "user", "content": text}]}
               for i, text in enumerate(["hello there", "the cat sat", "one two three", "abc abd", "good day"])]
    data = tmp_path / "synth.jsonl"
    synthesize(model, tokenizer, records, data, SynthesisOptions(max_new_tokens=8, batch_size=2))
    out = tmp_path / "w.safetensors"
    result = CliRunner().invoke(train_draft, ["--data", str(data), "--model", str(target_dir), "--output", str(out),
                                              "--layers", "0", "--steps", "3", "--batch-size", "2", "--heldout", "1",
                                              "--eval-every", "3", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["steps"] == "3"
        assert {n.split(".")[0] for n in f.keys()} == {"model"}
        assert not any(".layers.1." in n for n in f.keys())

    # Tensors far from the target's layers: continuing must start from them, and an lr that small
    # leaves them where they are.
    moved = build_draft(model, [0])
    with torch.no_grad():
        for p in moved.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    init = tmp_path / "init.safetensors"
    save_trained(moved, init, [0], steps=7, accuracy=0.0)
    common = ["--data", str(data), "--model", str(target_dir), "--batch-size", "2", "--heldout", "1", "--device", "cpu"]
    more = tmp_path / "more.safetensors"
    result = CliRunner().invoke(train_draft, [*common, "--init", str(init), "--output", str(more), "--layers", "0",
                                              "--steps", "2", "--eval-every", "2", "--lr", "1e-9"])
    assert result.exit_code == 0, result.output
    assert "continuing" in result.output
    with safe_open(str(more), "pt") as f, safe_open(str(init), "pt") as g:
        assert f.metadata()["steps"] == "9"
        assert set(f.keys()) == set(g.keys())
        for name in f.keys():
            torch.testing.assert_close(f.get_tensor(name), g.get_tensor(name), atol=1e-2, rtol=0)

    # Held-out conversations from a file of their own: the one that is also in --data is not trained on.
    held = tmp_path / "held.jsonl"
    synthesize(model, tokenizer, [records[0], {**records[1], "conversation_id": "other"}], held,
               SynthesisOptions(max_new_tokens=8, batch_size=2))
    result = CliRunner().invoke(train_draft, [*common, "--heldout-data", str(held), "--output", str(more), "--layers", "0",
                                              "--steps", "1", "--eval-every", "1"])
    assert result.exit_code == 0, result.output
    assert "1 --data conversations are held out" in result.output
    assert "4 training / 2 held-out conversations" in " ".join(result.output.split())
    # --data given twice: both copies of the conversation --heldout draws are kept out of training.
    result = CliRunner().invoke(train_draft, [*common, "--data", str(data), "--output", str(more), "--layers", "0",
                                              "--steps", "1", "--eval-every", "1"])
    assert result.exit_code == 0, result.output
    assert "1 --data conversations are held out" in result.output
    assert "8 training / 1 held-out conversations" in " ".join(result.output.split())
    unanswered = tmp_path / "unanswered.jsonl"
    unanswered.write_text(json.dumps(records[0]))
    result = CliRunner().invoke(train_draft, [*common, "--heldout-data", str(unanswered), "--output", str(more),
                                              "--layers", "0", "--steps", "1"])
    assert isinstance(result.exception, ConfigError) and "--heldout-data: no conversation ends" in str(result.exception)

    result = CliRunner().invoke(train_draft, [*common, "--init", str(init), "--output", str(more), "--layers", "0,1",
                                              "--steps", "1"])
    assert isinstance(result.exception, ConfigError)
    assert "trained from target layers 0, not --layers 0,1" in str(result.exception)
    result = CliRunner().invoke(train_draft, [*common, "--init", str(data), "--output", str(more), "--layers", "0", "--steps", "1"])
    assert isinstance(result.exception, ConfigError) and "is not a safetensors file" in str(result.exception)
