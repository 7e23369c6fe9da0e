"""`specdec train mtp` end to end on a tiny Llama target and its own answers: the held-out loss
falls; the export loads in the MTP plugin with speculative_model, and the --into-target-copy
directory loads as a target whose own checkpoint holds the layers; both draft without changing
greedy output; `specdec validate` measures it; a resumed run equals an uninterrupted one; bad
input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from specdec import LLM, SamplingParams
from specdec.cli.main import main
from specdec.testing.conformance import fixed_draft_len
from specdec.training.distributed import World
from specdec.training.examples import ExampleDataset, load_examples
from specdec.testing.training import Interrupted, answered, interrupted_after_save, saved_target
from specdec.training.state import STATE_FILE
from specdec_mtp.training.loop import FitOptions, MTPTarget, evaluate
from specdec_mtp.checkpoint import mtp_layer_tensors
from specdec_mtp.training.model import new_layers, start_from

OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
       "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
       "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
       "post_attention_layernorm.weight")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("mtp-train")
    target = saved_target(directory / "target")
    return {"dir": directory, "target": target, "target_dir": str(directory / "target"),
            "data": str(answered(target, directory))}


def train(files: dict, output: Path, *extra: str) -> list[str]:
    return ["train", "mtp", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
            "--output", str(output), "--num-layers", "2", "--batch-size", "4", "--precision", "float32", *extra]


def one_line_error(args: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert text in err, err


def generate(model: torch.nn.Module, config: dict | None, files: dict) -> list:
    target = files["target"]
    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    with LLM(model, config, tokenizer=target.tokenizer) as llm:
        return llm.generate(prompts, SamplingParams(max_tokens=16))


def test_train_export_draft_validate(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The held-out loss (here the training set itself: overfitting is the point) falls well below
    the new layers'; the export holds model.layers.{2,3}.* in DeepSeek-V3's names with Llama
    blocks; with it, and with the target copy holding the layers itself, greedy output is plain
    decoding's with drafts accepted; validate runs on both."""
    out, copy = files["dir"] / "layers", files["dir"] / "copy"
    target = files["target"]
    examples = load_examples((files["data"],), target.tokenizer, 2048)
    before = evaluate(new_layers(target.model, 2), MTPTarget(target.model), ExampleDataset(examples),
                      FitOptions(batch_size=4), World())
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", "--into-target-copy", str(copy))) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "training 2 MTP layer(s) (LlamaDecoderLayer blocks) on a frozen llama target: 16 conversations read" in err
    assert "held-out loss per depth" in err and "wrote 2 MTP layer(s) (float32)" in err
    record = json.loads((out / "training.json").read_text())
    assert record["position"] == {"step": 32, "epoch": 8, "batch": 0}
    after = record["heldout_loss_per_depth"]
    assert all(a < 0.7 * b for a, b in zip(after, before.losses)), (before.losses, after)

    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 2 and config["num_hidden_layers"] == 2
    assert set(load_file(str(out / "model.safetensors"))) == {f"model.layers.{i}.{n}" for i in (2, 3) for n in OWN}

    expected = [o.token_ids for o in generate(target.model, None, files)]
    outputs = generate(target.model, {"method": "mtp", "speculative_model": str(out), "max_draft_len": 2}, files)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0

    own = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32).eval()
    assert own.config.num_nextn_predict_layers == 2
    index = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.2.eh_proj.weight"] == "model-mtp.safetensors" and "model.layers.1.mlp.up_proj.weight" in index
    with safe_open(str(copy / "model-mtp.safetensors"), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("model.layers.3.eh_proj.weight"),
                           load_file(str(out / "model.safetensors"))["model.layers.3.eh_proj.weight"])
    from_copy = generate(own, {"method": "mtp", "max_draft_len": 2}, files)
    assert [o.token_ids for o in from_copy] == expected
    assert sum(o.metrics.num_accepted_tokens for o in from_copy) > 0

    for args in (["--model", files["target_dir"], "--speculative-model", str(out)], ["--model", str(copy)]):
        report = files["dir"] / "validate.json"
        assert main(["validate", *args, "--dtype", "float32", "--method", "mtp", "--dataset", files["data"],
                     "--num-prompts", "4", "--max-tokens", "16", "--json", str(report)]) == 0
        overall = json.loads(report.read_text())["overall"]
        assert overall["num_drafts"] > 0 and overall["mean_acceptance_length"] > 1.0


def test_layers_without_their_head_draft_through_the_target_lm_head(files: dict) -> None:
    """--omit-shared-head leaves shared_head.head out of the export; the plugin then projects
    through the target's lm_head, which is what training shared: the same run exported with the
    head drafts exactly the same (same output, same acceptance at a fixed draft length)."""
    common = ("--max-steps", "6", "--lr", "1e-2", "--warmup", "2", "--export-dtype", "float32")
    with_head, without = files["dir"] / "with-head", files["dir"] / "without-head"
    assert main(train(files, with_head, *common)) == 0
    assert main(train(files, without, *common, "--omit-shared-head")) == 0
    assert set(load_file(str(without / "model.safetensors"))) == \
        {f"model.layers.{i}.{n}" for i in (2, 3) for n in OWN if n != "shared_head.head.weight"}
    # A fixed draft length: the adaptive one follows measured forward costs, which vary between runs.
    runs = [generate(files["target"].model,
                     fixed_draft_len({"method": "mtp", "speculative_model": str(d), "max_draft_len": 2}), files)
            for d in (with_head, without)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    accepted = [[o.metrics.num_accepted_tokens for o in run] for run in runs]
    assert accepted[0] == accepted[1] and sum(accepted[0]) > 0


def test_one_layer_trained_over_more_depths_from_an_earlier_run(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """--init-from starts the layers from an earlier run's export (its weights exactly); with
    --num-depths 2 one layer is measured and trained at two depths, and its export drafts two
    tokens a step, the drafter reusing it, without changing greedy output. A resume must keep
    the depths."""
    first, second = files["dir"] / "one-depth", files["dir"] / "two-depths"
    one = [*train(files, first, "--max-steps", "4", "--lr", "1e-2", "--export-dtype", "float32")]
    one[one.index("--num-layers") + 1] = "1"
    assert main(one) == 0
    target = files["target"].model
    started = new_layers(target, 1)
    start_from(started, first, target.config)
    stored = load_file(str(first / "model.safetensors"))
    assert all(torch.equal(stored[name], tensor) for name, tensor in mtp_layer_tensors(started[0], 2).items())
    capsys.readouterr()
    two = [*one[:one.index("--output")], "--output", str(second), *one[one.index("--output") + 2:]]
    common = ("--num-depths", "2", "--init-from", str(first), "--eval-data", files["data"])
    assert main([*two, *common]) == 0
    assert "training 1 MTP layer(s) trained over 2 depths" in " ".join(capsys.readouterr().err.split())
    record = json.loads((second / "training.json").read_text())
    assert len(record["heldout_loss_per_depth"]) == len(record["train_loss_per_depth"]) == 2
    assert json.loads((second / "config.json").read_text())["num_nextn_predict_layers"] == 1
    expected = [o.token_ids for o in generate(target, None, files)]
    outputs = generate(target, fixed_draft_len({"method": "mtp", "speculative_model": str(second), "max_draft_len": 2}),
                       files)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
    one_line_error([*two, "--resume"], "--resume: the saved state holds 1 MTP layer(s) trained over 2 depths, "
                   "this run asks for 1 MTP layer(s)", capsys)
    one_line_error([*train(files, files["dir"] / "o2", "--init-from", str(first))],
                   f"--init-from: MTP layers in {first}: missing tensor model.layers.3.", capsys)


def test_states_cached_by_either_trainer_replace_the_target(files: dict, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--cache-states: states cached by `train medusa` (the same target and conversations) are
    read by `train mtp`, which then never runs the target and trains as a run without the cache
    does; --train-vocab is recorded and said."""
    cache, plain, cached = files["dir"] / "states", files["dir"] / "uncached", files["dir"] / "cached"
    common = ("--max-steps", "4", "--export-dtype", "float32", "--train-vocab", "12")
    assert main(["train", "medusa", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
                 "--output", str(files["dir"] / "medusa"), "--max-steps", "1", "--precision", "float32",
                 "--cache-states", str(cache)]) == 0
    assert main(train(files, plain, *common)) == 0
    assert "softmax over the 12 most frequent reply tokens" in " ".join(capsys.readouterr().err.split())

    def no_target(*args, **kwargs):
        raise AssertionError("the target ran")

    from transformers.models.llama.modeling_llama import LlamaModel
    monkeypatch.setattr(LlamaModel, "forward", no_target)
    assert main(train(files, cached, *common, "--cache-states", str(cache))) == 0
    assert json.loads((cached / "training.json").read_text())["options"]["train_vocab"] == 12
    a, b = load_file(str(plain / "model.safetensors")), load_file(str(cached / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_resume_takes_the_steps_an_uninterrupted_run_takes(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped after its step-3 save and resumed ends with exactly the layers (and
    optimizer state) of a run never stopped: same batches, schedule and Adam moments."""
    whole, resumed = files["dir"] / "whole", files["dir"] / "resumed"
    common = ("--max-steps", "7", "--save-every", "3", "--export-dtype", "float32")
    assert main(train(files, whole, *common)) == 0
    with interrupted_after_save(3), pytest.raises(Interrupted):
        main(train(files, resumed, *common))
    capsys.readouterr()
    assert json.loads((resumed / "training.json").read_text())["position"]["step"] == 3
    one_line_error(train(files, resumed, *common), "holds a training state; pass --resume to continue it", capsys)
    assert main(train(files, resumed, *common, "--resume")) == 0
    assert "resuming from step 3 (epoch 1, batch 3)" in " ".join(capsys.readouterr().err.split())
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = torch.load(whole / STATE_FILE, weights_only=True)
    state_b = torch.load(resumed / STATE_FILE, weights_only=True)
    assert state_a["position"] == state_b["position"] == {"step": 7, "epoch": 1, "batch": 3}
    moments = [(s["exp_avg"], s["exp_avg_sq"]) for s in state_a["optimizer"]["state"].values()]
    others = [(s["exp_avg"], s["exp_avg_sq"]) for s in state_b["optimizer"]["state"].values()]
    assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(moments, others))
    one_line_error([*train(files, resumed, *common, "--resume"), "--num-layers", "1"],
                   "--resume: the saved state holds 2 MTP layer(s), this run asks for 1", capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--num-layers", "0"], "--num-layers: must be at least 1, got 0"),
    (["--num-layers", "2", "--num-depths", "1"], "--num-depths: must be at least --num-layers (2), got 1"),
    (["--max-steps", "0"], "--max-steps: must be at least 1, got 0"),
    (["--lr", "0"], "--lr: must be positive, got 0.0"),
    (["--eval-fraction", "0.1", "--eval-data", "x"], "--eval-fraction and --eval-data are alternatives; give one"),
    (["--into-target-copy", "o"], "--into-target-copy: must be another directory than --output"),
])
def test_bad_options_are_one_line(extra: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(["train", "mtp", "--data", "nothing.jsonl", "--output", "o", *extra], message, capsys)


def test_bad_files_are_one_line(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["train", "mtp", "--data", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o")],
                   f"--data: no file {str(tmp_path / 'missing.jsonl')!r}", capsys)
    one_line_error(train(files, tmp_path / "o", "--resume"), "--resume: no training_state.pt in", capsys)
    unanswered = tmp_path / "unanswered.jsonl"
    unanswered.write_text('{"conversation_id": 1, "conversations": [{"role": "user", "content": "hi"}]}\n')
    one_line_error(train(files, tmp_path / "o", "--eval-data", str(unanswered)),
                   "--eval-data: no conversation has an assistant reply to measure on", capsys)
