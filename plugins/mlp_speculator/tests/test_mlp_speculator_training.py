"""`specdec train mlp-speculator` end to end on a tiny target and its own answers: the held-out
loss falls and the chain estimate rises, the export in IBM's layout drafts without changing greedy
output, tied stages train and export, a compact speculator trains over a draft vocabulary and exports the
full layout, a second stage starts from the first, a resumed run equals an uninterrupted one, bad
input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec import LLM, SamplingParams
from specdec.cli.main import main
from specdec.draft_vocab import load_ranking
from specdec.testing.tiny import shuffled_ranking
from specdec.testing.training import Interrupted, answered, interrupted_after_save, saved_target
from specdec.training import ExampleDataset, FrozenTarget, World, load_examples
from specdec_mlp_speculator import MLPSpeculator, SpeculatorSpec, load_speculator
from specdec_mlp_speculator.training.loop import FitOptions, evaluate


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("mlp-train")
    path = directory / "target"
    target = saved_target(path)
    return {"dir": directory, "target": target, "target_dir": str(path), "data": str(answered(target, directory))}


def train(files: dict, output: Path, *extra: str) -> list[str]:
    return ["train", "mlp-speculator", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
            "--output", str(output), "--batch-size", "4", "--precision", "float32", "--top-k-tokens-per-head", "2,2,1",
            *extra]


def one_line_error(args: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert text in err, err


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_train_export_draft(files: dict, tied: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """Trained on its own held-out set (overfitting is the point), the speculator's loss falls well
    below an untrained one's and its chain estimate rises; the export loads as published and drafts
    trees and chains that leave greedy output unchanged while drafts are accepted."""
    out = files["dir"] / ("tied" if tied else "untied")
    target = files["target"]
    config = target.model.config
    untrained = MLPSpeculator(SpeculatorSpec(config.hidden_size, config.hidden_size, 3, config.vocab_size, tied, True))
    torch.manual_seed(0)
    untrained.reset_parameters()
    examples = load_examples((files["data"],), target.tokenizer, 2048)
    before = evaluate(untrained, FrozenTarget(target.model), ExampleDataset(examples), FitOptions(batch_size=4), World())
    tie = ["--tie-weights"] if tied else []
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", *tie)) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "training an MLP speculator of 3 stages x 64" in err and "held-out loss per stage" in err
    record = json.loads((out / "training.json").read_text())
    assert all(a < 0.7 * b for a, b in zip(record["heldout_loss_per_stage"], before.losses)), record
    assert record["heldout_chain_acceptance_length"] > before.acceptance_length
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "mlp_speculator" and saved["tie_weights"] is tied
    assert saved["top_k_tokens_per_head"] == [2, 2, 1]
    assert {f"head.{i}.weight" for i in range(3)} <= set(load_file(str(out / "model.safetensors")))
    assert load_speculator(out, config.hidden_size, config.vocab_size).spec.tie_weights is tied

    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    with LLM(target.model, {"method": "mlp_speculator", "model": str(out), "adaptive_draft_len": False},
             tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


def test_train_over_a_draft_vocabulary(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--train-vocab`` with ``--draft-vocab``: the stages train over that ranking's first tokens
    only (the optimizer holds their rows and one shared embedding row), the export is IBM's full
    layout, and drafting over the same draft vocabulary leaves greedy output unchanged while drafts
    are accepted; ``--compact-export`` writes the same speculator as a compact checkpoint."""
    target = files["target"]
    config = target.model.config
    ranking = shuffled_ranking(config.vocab_size, tmp_path / "ranking.safetensors")
    kept = load_ranking(ranking, config.vocab_size)[:30]
    out = tmp_path / "compact"
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", "--train-vocab", "30", "--draft-vocab", str(ranking))) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "softmax over the 30 first tokens of " in err, err  # then the path, which rich may wrap
    state = torch.load(out / "training_state.pt", weights_only=False)
    assert state["parameters"]["emb.0.weight"].shape[0] == 31 and state["parameters"]["head.0.weight"].shape[0] == 30
    weights = load_file(str(out / "model.safetensors"))
    assert weights["emb.0.weight"].shape[0] == config.vocab_size
    outside = torch.ones(config.vocab_size, dtype=torch.bool)
    outside[kept] = False
    assert not weights["head.0.weight"][outside].any()

    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    with LLM(target.model, {"method": "mlp_speculator", "model": str(out), "adaptive_draft_len": False,
                            "draft_vocab": str(ranking), "draft_vocab_size": 30}, tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0

    # The finished run exported again as a compact checkpoint: its 30 rows, the same speculator.
    full = load_speculator(out, config.hidden_size, config.vocab_size)
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", "--train-vocab", "30", "--draft-vocab", str(ranking), "--resume",
                      "--compact-export")) == 0
    assert load_file(str(out / "model.safetensors"))["head.0.weight"].shape[0] == 30
    loaded = load_speculator(out, config.hidden_size, config.vocab_size)
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), loaded.state_dict().values()))
    capsys.readouterr()
    for extra, message in ((["--draft-vocab", str(ranking)], "--draft-vocab: needs --train-vocab, the number of its tokens"),
                           (["--compact-export"], "--compact-export: needs --train-vocab, the draft vocabulary it keeps")):
        one_line_error(train(files, tmp_path / "o", *extra), message, capsys)


def test_second_stage_starts_from_the_first(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--init-from`` (IBM's second stage) starts from the named speculator, its shape and all, over
    the whole vocabulary or narrowed to a draft vocabulary; a shape option beside it is refused."""
    config = files["target"].model.config
    first = tmp_path / "first"
    assert main(train(files, first, "--max-steps", "4", "--export-dtype", "float32", "--n-predict", "2",
                      "--top-k-tokens-per-head", "2,1")) == 0
    before = load_file(str(first / "model.safetensors"))
    ranking = shuffled_ranking(config.vocab_size, tmp_path / "ranking.safetensors")
    kept = load_ranking(ranking, config.vocab_size)[:30]
    still = ("--max-steps", "1", "--lr", "1e-12", "--export-dtype", "float32", "--init-from", str(first))
    for name, extra in (("whole", ()), ("narrowed", ("--train-vocab", "30", "--draft-vocab", str(ranking)))):
        out = tmp_path / name
        assert main(["train", "mlp-speculator", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
                     "--output", str(out), "--precision", "float32", *still, *extra]) == 0
        assert f"training an MLP speculator of 2 stages x 64 from {first}" in " ".join(capsys.readouterr().err.split())
        after = load_file(str(out / "model.safetensors"))
        assert after.keys() == before.keys()
        rows = kept if extra else slice(None)
        for key in after:
            sliced = key.startswith(("emb.", "head."))
            torch.testing.assert_close(after[key][rows] if sliced else after[key], before[key][rows] if sliced else before[key],
                                       atol=1e-6, rtol=0)
    one_line_error(train(files, tmp_path / "o", "--init-from", str(first), "--n-predict", "2"),
                   "--init-from: the speculator it names sets the shape; leave out --n-predict, --top-k-tokens-per-head",
                   capsys)


def test_resume_takes_the_steps_an_uninterrupted_run_takes(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Tied stages (each shared weight saved and stepped once): a run stopped after its step-3 save
    and resumed ends with the weights of a run never stopped; another shape is refused by name."""
    whole, resumed = files["dir"] / "whole", files["dir"] / "resumed"
    common = ("--max-steps", "6", "--save-every", "3", "--export-dtype", "float32", "--tie-weights")
    assert main(train(files, whole, *common)) == 0
    with interrupted_after_save(3), pytest.raises(Interrupted):
        main(train(files, resumed, *common))
    capsys.readouterr()
    assert main(train(files, resumed, *common, "--resume")) == 0
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    one_line_error(train(files, resumed, *common[:-1], "--resume"),
                   "the saved state holds a speculator {'n_predict': 3, 'inner_dim': 64, 'tie_weights': True", capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--n-predict", "0"], "--n-predict: must be at least 1, got 0"),
    (["--top-k-tokens-per-head", "2,2"], "--top-k-tokens-per-head: needs 3 counts of at least 1 (one per stage), got '2,2'"),
    (["--top-k-tokens-per-head", "a,b,c"], "--top-k-tokens-per-head: expected comma-separated counts, got 'a,b,c'"),
])
def test_bad_options_are_one_line(files: dict, extra: list[str], message: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error([*train(files, tmp_path / "o"), *extra], message, capsys)
