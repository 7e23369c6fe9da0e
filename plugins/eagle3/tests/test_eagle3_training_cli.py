"""`specdec train eagle3 {dump,fit,export}` and `specdec validate` as real subprocesses on a tiny target
(further runs of a command already proven so, and the error cases, in process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eagle3_training_data import save_target, synthesized, tiny_target

from specdec.cli.main import main
from specdec.models import resolve_device, resolve_dtype
from specdec.testing.training import Interrupted, interrupted_after_save
from specdec.training import STATE_FILE
from specdec_eagle3 import load_head
from specdec_eagle3.training.loop import export


def specdec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdec.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"})


def one_line_error(args: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In process (fast): exit code 2 and one line on stderr naming the problem."""
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert text in err, err


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("cli")
    target = tiny_target()
    return {"dir": directory, "target": save_target(target, directory / "target"),
            "data": synthesized(target, directory, count=16, max_new_tokens=24)}


def test_dump_fit_export_validate(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The whole workflow from the command line: the head it writes loads in both layouts and drafts,
    and a later fit continues it (`--init-head`) with its own draft vocabulary or a recalibrated one."""
    d, target = files["dir"], str(files["target"])
    result = specdec("train", "eagle3", "dump", "--model", target, "--dtype", "float32", "--data", str(files["data"]),
                     "--output", str(d / "dump"), "--layers", "0,1,2", "--shard-size", "5")
    assert result.returncode == 0, result.stderr
    assert "dumped 16 conversations" in result.stderr and (d / "dump" / "shard-00003.safetensors").exists()
    result = specdec("train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "head"),
                     "--draft-vocab-size", "20", "--ttt-steps", "3", "--steps", "4", "--batch-size", "4", "--lr", "1e-3",
                     "--heldout", "4", "--eval-every", "2")
    assert result.returncode == 0, result.stderr
    assert "offline training: 12 conversations (4 held out), layers [0, 1, 2], draft vocabulary 20 tokens" in result.stderr
    assert "held-out: " in result.stderr
    record = json.loads((d / "head" / "training.json").read_text())
    assert record["position"]["step"] == 4 and len(record["train_accuracy_per_step"]) == 3 and record["options"]["decay"] == 0.8
    # Defaults: batches of similar length; bfloat16 mixed precision where the device the command
    # picks (CUDA when present) computes it natively.
    native = resolve_dtype("auto", resolve_device(None)) == torch.bfloat16
    assert record["options"]["group_by_length"] is True and record["options"]["bf16"] is native
    assert ("bfloat16 mixed precision" if native else "float32 precision") in " ".join(result.stderr.split())
    assert record["heldout_step"] == 4 and len(record["heldout_accuracy_per_step"]) == 3 and record["heldout_conversations"] == 4
    head = load_head(d / "head")
    assert head.config.draft_vocab_size == 20 and head.config.layers_to_capture == (0, 1, 2)
    assert json.loads((d / "head" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    # The later fits in process: the real process was proven above, and each start costs seconds.
    capsys.readouterr()
    assert main(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "continued"),
                 "--init-head", str(d / "head"), "--ttt-steps", "3", "--steps", "2", "--batch-size", "4", "--lr", "1e-3"]) == 0
    assert "draft vocabulary 20 tokens" in " ".join(capsys.readouterr().err.split())
    continued = load_head(d / "continued")
    assert torch.equal(continued.d2t, head.d2t) and torch.equal(continued.t2d, head.t2d)
    assert not torch.equal(continued.fc.weight, head.fc.weight)
    assert json.loads((d / "continued" / "training.json").read_text())["init_head"] == str(d / "head")
    assert main(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "recalibrated"),
                 "--init-head", str(d / "head"), "--draft-vocab-size", "28", "--ttt-steps", "3", "--steps", "1",
                 "--batch-size", "4"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # rich wraps lines at the terminal's width
    assert "recalibrated the draft vocabulary on this data: 20 of its 28 tokens keep the head's output rows" in err
    assert load_head(d / "recalibrated").config.draft_vocab_size == 28
    assert main(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "deeper"),
                 "--init-head", str(d / "head"), "--num-layers", "2", "--layout", "speculators", "--ttt-steps", "2",
                 "--steps", "1", "--batch-size", "4"]) == 0
    capsys.readouterr()
    assert load_head(d / "deeper").config.num_layers == 2
    assert json.loads((d / "deeper" / "training.json").read_text())["num_layers"] == 2
    one_line_error(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "x"), "--init-head",
                    str(d / "deeper")], "has 2 decoder layers; the SafeAILab layout holds one, so give --layout speculators", capsys)
    one_line_error(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "x"), "--init-head",
                    str(d / "deeper"), "--num-layers", "1", "--layout", "speculators"], "a head cannot lose layers", capsys)
    head.config.layers_to_capture = (0, 1, 3)
    export(head, str(d / "other-layers"), "safeailab", torch.float32, "tiny", (), 3)
    one_line_error(["train", "eagle3", "fit", "--offline-data", str(d / "dump"), "--output", str(d / "x"), "--init-head",
                    str(d / "other-layers")], "fuses target layers [0, 1, 3], the data has layers [0, 1, 2]", capsys)
    result = specdec("train", "eagle3", "export", "--head", str(d / "head"), "--output", str(d / "spec"),
                     "--layout", "speculators", "--verifier", target)
    assert result.returncode == 0, result.stderr
    assert json.loads((d / "spec" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    result = specdec("validate", "--model", target, "--dtype", "float32", "--method", "eagle3", "--speculative-model",
                     str(d / "spec"), "--max-draft-len", "3", "--dataset", str(files["data"]), "--num-prompts", "4",
                     "--max-tokens", "16", "--json", str(d / "validate.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads((d / "validate.json").read_text())
    overall = report["overall"]
    assert report["method"] == "eagle3" and set(report["categories"]) == {"conversations"}
    assert overall["num_drafts"] > 0 and overall["mean_acceptance_length"] == 1 + overall["num_accepted_tokens"] / overall["num_drafts"]
    assert "mean accept len" in result.stdout and "overall" in result.stdout


def test_fit_measures_agreement_on_heldout_data(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--heldout-data` measures agreement on a dump of its own and keeps those conversations out of
    training wherever they appear; a dump of other layers is refused in one line."""
    target, data = str(files["target"]), str(files["data"])
    dumps = {"all": ("0,1,2", []), "held": ("0,1,2", ["--limit", "4"]), "other": ("0,2", ["--limit", "4"])}
    for name, (layers, limit) in dumps.items():
        assert main(["train", "eagle3", "dump", "--model", target, "--dtype", "float32", "--data", data,
                     "--output", str(tmp_path / name), "--layers", layers, *limit]) == 0
    capsys.readouterr()
    assert main(["train", "eagle3", "fit", "--offline-data", str(tmp_path / "all"), "--heldout-data", str(tmp_path / "held"),
                 "--output", str(tmp_path / "head"), "--draft-vocab-size", "20", "--ttt-steps", "2", "--steps", "2",
                 "--batch-size", "4", "--precision", "float32", "--no-group-by-length"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # rich wraps lines at the terminal's width
    assert "offline training: 12 conversations (4 held-out conversations from --heldout-data, 4 of them in the training data)" in err
    record = json.loads((tmp_path / "head" / "training.json").read_text())
    assert record["heldout_conversations"] == 4 and record["eval_data"] == [str(tmp_path / "held")]
    assert record["heldout_step"] == 2 and len(record["heldout_accuracy_per_step"]) == 2
    assert 1.0 <= record["heldout_acceptance_length"] <= 3.0
    assert f"predicted acceptance length of a chain of 2: {record['heldout_acceptance_length']:.2f}" in err
    assert record["options"]["bf16"] is False and record["options"]["group_by_length"] is False and "float32 precision" in err
    one_line_error(["train", "eagle3", "fit", "--offline-data", str(tmp_path / "all"), "--heldout-data", str(tmp_path / "other"),
                    "--output", str(tmp_path / "x")], "--heldout-data: its layers [0, 2] differs from --offline-data's [0, 1, 2]", capsys)
    one_line_error(["train", "eagle3", "fit", "--offline-data", str(tmp_path / "held"), "--heldout-data", str(tmp_path / "held"),
                    "--output", str(tmp_path / "x")], "--heldout-data: every training conversation is held out", capsys)
    unanswered = tmp_path / "unanswered.jsonl"
    unanswered.write_text('{"conversation_id": 1, "conversations": [{"role": "user", "content": "hi"}]}\n')
    one_line_error(["train", "eagle3", "fit", "--data", data, "--model", target, "--layers", "0,1", "--heldout-data", str(unanswered),
                    "--output", str(tmp_path / "x")], "--heldout-data: no conversation has an assistant reply to measure agreement on",
                   capsys)


def test_resume_takes_the_steps_an_uninterrupted_run_takes(files: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """On the core loop, a fit stopped after its step-3 save and resumed ends with exactly the head
    (and Adam moments) of a fit never stopped; a new fit refuses an output holding a state, and a
    resumed one a head of another shape."""
    assert main(["train", "eagle3", "dump", "--model", str(files["target"]), "--dtype", "float32", "--data", str(files["data"]),
                 "--output", str(tmp_path / "dump"), "--layers", "0,1,2"]) == 0
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"

    def fit(output: Path, *extra: str) -> list[str]:
        return ["train", "eagle3", "fit", "--offline-data", str(tmp_path / "dump"), "--output", str(output), "--draft-vocab-size",
                "20", "--ttt-steps", "2", "--steps", "7", "--save-every", "3", "--batch-size", "4", "--lr", "1e-3",
                "--export-dtype", "float32", "--precision", "float32", *extra]

    assert main(fit(whole)) == 0
    with interrupted_after_save(3), pytest.raises(Interrupted):
        main(fit(resumed))
    capsys.readouterr()
    assert json.loads((resumed / "training.json").read_text())["position"]["step"] == 3
    one_line_error(fit(resumed), "holds a training state; pass --resume to continue it", capsys)
    assert main(fit(resumed, "--resume")) == 0
    assert "resuming from step 3 (epoch 1, batch 3)" in " ".join(capsys.readouterr().err.split())
    a, b = load_head(whole).state_dict(), load_head(resumed).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    states = [torch.load(d / STATE_FILE, weights_only=True) for d in (whole, resumed)]
    assert states[0]["position"] == states[1]["position"] == {"step": 7, "epoch": 1, "batch": 3}
    moments = [[(s["exp_avg"], s["exp_avg_sq"]) for s in state["optimizer"]["state"].values()] for state in states]
    assert all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in zip(*moments))
    one_line_error(fit(resumed, "--resume", "--draft-vocab-size", "24"),
                   "the saved state holds a head {'num_layers': 1, 'layers_to_capture': [0, 1, 2], 'draft_vocab_size': 20", capsys)


def test_online_fit(files: dict[str, Path]) -> None:
    d = files["dir"]
    result = specdec("train", "eagle3", "fit", "--data", str(files["data"]), "--model", str(files["target"]), "--dtype", "float32",
                     "--layers", "0,2", "--output", str(d / "online"), "--layout", "speculators", "--draft-vocab-size", "36",
                     "--ttt-steps", "2", "--steps", "2", "--export-dtype", "float32")
    assert result.returncode == 0, result.stderr
    assert "online training: 16 conversations, layers [0, 2]" in result.stderr
    assert load_head(d / "online").config.layers_to_capture == (0, 2)


@pytest.mark.parametrize(("args", "message"), [
    (["train", "eagle3", "fit", "--output", "x"], "give exactly one of --offline-data (a dump) or --data"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x"], "no index.json (not a dump"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--steps", "0"], "--steps: must be positive"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--loss-decay", "1.5"], "--loss-decay: must be in (0, 1]"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--argmax-weight", "-0.1"], "--argmax-weight: must be in [0, 1]"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--heldout", "-1"], "--heldout and --eval-every must be >= 0"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--heldout", "2", "--heldout-data", "."],
     "--heldout and --heldout-data are alternatives; give one"),
    (["train", "eagle3", "fit", "--offline-data", ".", "--output", "x", "--num-layers", "2"],
     "--num-layers: the SafeAILab layout holds one decoder layer; for 2 give --layout speculators"),
    (["validate", "--dataset", "spec_bench"], "validate needs --config or --method"),
    (["validate", "--method", "ngram", "--dataset", "nope.jsonl"], "--dataset: cannot read 'nope.jsonl'"),
])
def test_bad_input_is_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(args, message, capsys)


def test_bad_layers_and_data_are_one_line(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = str(files["target"])
    one_line_error(["train", "eagle3", "dump", "--model", target, "--data", str(files["data"]), "--output", str(tmp_path / "b"),
                    "--layers", "0,7"], "--layers: need distinct layers in 0..2 for this 3-layer target, got [0, 7]", capsys)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation_id": 1, "conversations": [{"role": "user", "content": "hi"}]}\n')
    one_line_error(["train", "eagle3", "fit", "--data", str(bad), "--model", target, "--layers", "0,1", "--output",
                    str(tmp_path / "c")], "--data: no conversation has an assistant reply to train on", capsys)


def test_bad_input_from_a_real_process(tmp_path: Path) -> None:
    result = specdec("train", "eagle3", "fit", "--offline-data", str(tmp_path), "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: --offline-data {str(tmp_path)!r}: no index.json (not a dump, or the dump was interrupted)"]
