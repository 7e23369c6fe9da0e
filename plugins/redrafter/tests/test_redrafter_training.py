"""`specdec train redrafter` end to end on a tiny target and its own answers: the held-out loss
falls and the chain estimate rises, the export in Apple's layout drafts beam trees without changing
greedy output, a drafter trains over a draft vocabulary and exports full or compact, a resumed run
equals an uninterrupted one, bad input is one line."""

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
from specdec_redrafter import DrafterSpec, RecurrentDrafter, load_drafter
from specdec_redrafter.training.loop import FitOptions, evaluate


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("redrafter-train")
    path = directory / "target"
    target = saved_target(path)
    return {"dir": directory, "target": target, "target_dir": str(path), "data": str(answered(target, directory))}


def train(files: dict, output: Path, *extra: str) -> list[str]:
    return ["train", "redrafter", "--model", files["target_dir"], "--dtype", "float32", "--data", files["data"],
            "--output", str(output), "--batch-size", "4", "--precision", "float32", "--positions", "3",
            "--num-draft-layers", "1", *extra]


def test_train_export_draft(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Trained on its own held-out set (overfitting is the point), the drafter's loss falls well
    below an untrained one's and its chain estimate rises; the export loads as Apple's layout and
    drafts beam trees that leave greedy output unchanged while drafts are accepted."""
    out = files["dir"] / "trained"
    target = files["target"]
    config = target.model.config
    torch.manual_seed(0)
    untrained = RecurrentDrafter(DrafterSpec(config.hidden_size, config.vocab_size, 2 * config.hidden_size, 1, True))
    embed = target.model.get_input_embeddings()
    examples = load_examples((files["data"],), target.tokenizer, 2048)
    options = FitOptions(batch_size=4, positions=3)
    before = evaluate(untrained, embed, FrozenTarget(target.model), ExampleDataset(examples), options, World())
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", "--redrafter-num-beams", "3", "--redrafter-draft-len-per-beam", "3")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "training a ReDrafter drafter of 1 blocks x 128, recurrent for 3 positions" in err, err
    assert "held-out loss per position" in err
    record = json.loads((out / "training.json").read_text())
    assert all(a < 0.7 * b for a, b in zip(record["heldout_loss_per_position"], before.losses)), record
    assert record["heldout_chain_acceptance_length"] > before.acceptance_length
    saved = json.loads((out / "config.json").read_text())
    assert saved["model_type"] == "recurrent_drafting_drafter" and saved["exit_dim"] == 2 * config.hidden_size
    assert saved["redrafter_num_beams"] == 3 and saved["redrafter_draft_len_per_beam"] == 3
    assert {"lm_head.0.linear.weight", "lm_head.1.weight", "rnn_u.bias", "rnn_w.weight"} <= set(
        load_file(str(out / "model.safetensors")))
    load_drafter(out, config.hidden_size, config.vocab_size)

    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    with LLM(target.model, {"method": "redrafter", "model": str(out), "adaptive_draft_len": False,
                            "redrafter_num_beams": 3, "max_draft_len": 3}, tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


def test_resume_takes_the_steps_an_uninterrupted_run_takes(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped after its step-3 save and resumed ends with the weights of a run never
    stopped; another shape is refused by name."""
    whole, resumed = files["dir"] / "whole", files["dir"] / "resumed"
    common = ("--max-steps", "6", "--save-every", "3", "--export-dtype", "float32")
    assert main(train(files, whole, *common)) == 0
    with interrupted_after_save(3), pytest.raises(Interrupted):
        main(train(files, resumed, *common))
    capsys.readouterr()
    assert main(train(files, resumed, *common, "--resume")) == 0
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    code = main([*train(files, resumed, *common, "--resume"), "--no-rnn"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert ("the saved state holds a drafter {'exit_dim': 128, 'num_draft_layers': 1, 'rnn': True, "
            "'output_rows': 36}") in err, err


def test_train_over_a_draft_vocabulary(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--train-vocab`` with ``--draft-vocab``: only that ranking's first tokens' output rows
    train, the export is Apple's full layout (zero rows elsewhere), drafting over the same draft
    vocabulary leaves greedy output unchanged while drafts are accepted; ``--compact-export``
    writes the same drafter as a compact checkpoint, which drafts alone as the export narrowed does."""
    target = files["target"]
    config = target.model.config
    ranking = shuffled_ranking(config.vocab_size, tmp_path / "ranking.safetensors")
    kept = load_ranking(ranking, config.vocab_size)[:30]
    out = tmp_path / "compact"
    vocab = ("--train-vocab", "30", "--draft-vocab", str(ranking))
    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", *vocab)) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "softmax over the 30 first tokens of " in err, err
    state = torch.load(out / "training_state.pt", weights_only=False)
    assert state["parameters"]["lm_head.1.weight"].shape[0] == 30
    weights = load_file(str(out / "model.safetensors"))
    assert weights["lm_head.1.weight"].shape[0] == config.vocab_size and "token_ids" not in weights
    outside = torch.ones(config.vocab_size, dtype=torch.bool)
    outside[kept] = False
    assert not weights["lm_head.1.weight"][outside].any()

    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    method = {"method": "redrafter", "adaptive_draft_len": False, "redrafter_num_beams": 3, "max_draft_len": 3}
    with LLM(target.model, {**method, "model": str(out), "draft_vocab": str(ranking), "draft_vocab_size": 30},
             tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    accepted = [o.metrics.num_accepted_tokens for o in outputs]
    assert sum(accepted) > 0

    assert main(train(files, out, "--epochs", "8", "--lr", "1e-2", "--warmup", "2", "--eval-data", files["data"],
                      "--export-dtype", "float32", *vocab, "--resume", "--compact-export")) == 0
    weights = load_file(str(out / "model.safetensors"))
    assert weights["lm_head.1.weight"].shape[0] == 30 and weights["token_ids"].tolist() == kept.sort().values.tolist()
    with LLM(target.model, {**method, "model": str(out)}, tokenizer=target.tokenizer) as llm:
        outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert [o.metrics.num_accepted_tokens for o in outputs] == accepted
    capsys.readouterr()
    code = main([*train(files, tmp_path / "o"), "--compact-export"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--compact-export: needs --train-vocab, the draft vocabulary it keeps" in err, err


@pytest.mark.parametrize("extra, message", [
    (("--positions", "0"), "--positions: must be at least 1, got 0"),
    (("--redrafter-draft-len-per-beam", "4"), "--redrafter-draft-len-per-beam: 4 exceeds --positions 3"),
])
def test_bad_options_are_one_line(files: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, message) -> None:
    code = main([*train(files, tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert message in err, err
