"""PARD training: the layout's queries are exactly what a PARD draft computes at inference, COD
keeps every query's run, and `specdec train pard` adapts a draft end to end (its held-out
accuracy past depth 1 rises, the export loads as a PARD draft and drafts in parallel without
changing greedy output); bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from draft_target_helpers import save
from specdec import LLM, SamplingParams
from specdec.cli.main import main
from specdec.testing.conformance import fixed_draft_len
from specdec.testing.training import answered, saved_target
from specdec_draft_target import DraftTargetDecodingConfig
from specdec_draft_target.pard import PardDraft, pard_layout
from specdec_draft_target.train import build_draft

MASK = 3


@pytest.mark.parametrize("keep", [1.0, 0.5])
def test_layout_queries_equal_inference_forwards(tiny, keep: float) -> None:
    """Query (copy j, position p) of one training forward gives the draft's state at the j-th
    mask fed after tokens 0..p-j, as inference feeds them, also with queries dropped (COD)."""
    draft = build_draft(tiny.model, [0, 1]).to(tiny.model.device).eval()
    module = PardDraft(draft, MASK)
    ids = torch.tensor([tiny.encode("the cat sat on the mat")[:12]], device=tiny.model.device)
    layout = pard_layout(ids.shape[1], 4, keep, 0.2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = module.hidden(ids, layout)[0]
        for n, (j, p) in enumerate(zip(layout.copy.tolist(), layout.position.tolist())):
            fed = ids[0, : p - j + 1].tolist() + [MASK] * j
            alone = draft.model(input_ids=torch.tensor([fed], device=ids.device)).last_hidden_state[0, -1]
            torch.testing.assert_close(hidden[n], alone, atol=1e-4, rtol=1e-4)
    assert (layout.copy == 3).any()


def test_cod_keeps_each_querys_run() -> None:
    """Every kept mask query's predecessor in its run is kept; deeper copies keep fewer queries,
    never below keep_min of the length."""
    layout = pard_layout(200, 7, 0.7, 0.2, torch.Generator().manual_seed(1))
    kept = set(zip(layout.copy.tolist(), layout.position.tolist()))
    assert all((j - 1, p - 1) in kept for j, p in kept if j > 0)
    counts = torch.bincount(layout.copy).tolist()
    assert counts == [200] + [int(200 * max(0.7**j, 0.2)) for j in range(1, 7)]
    assert counts[-2:] == [40, 40]
    full = pard_layout(200, 5)
    assert torch.bincount(full.copy).tolist() == [200, 199, 198, 197, 196]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("pard-train")
    target = saved_target(directory / "target")
    draft = build_draft(target.model, [0])
    plain = save(draft, target.tokenizer, directory / "draft")
    draft.config.pard_token = MASK  # the same draft, untrained as a PARD draft
    untrained = save(draft, target.tokenizer, directory / "untrained-pard")
    return {"dir": directory, "target": target, "target_dir": str(directory / "target"), "draft": str(plain),
            "untrained": str(untrained), "data": str(answered(target, directory))}


def train(files: dict, output: Path, *extra: str, mask: bool = True) -> list[str]:
    return ["train", "pard", "--model", files["target_dir"], "--draft", files["draft"], "--dtype", "float32",
            "--data", files["data"], "--output", str(output), "--batch-size", "4", "--precision", "float32",
            *(["--mask-token", str(MASK)] if mask else []), *extra]


def test_train_pard_end_to_end(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """Training on the target's own answers (held out: the same, overfitting is the point) lifts
    the accuracy of depths 2 and 3 well above the autoregressive draft's; the export is a
    checkpoint with pard_token in its config, which drafts in parallel by default, accepts more
    drafts past the first than before training, and leaves greedy output unchanged."""
    out = files["dir"] / "pard"
    assert main(train(files, out, "--epochs", "10", "--lr", "3e-3", "--warmup", "2", "--depths", "3",
                      "--eval-data", files["data"], "--export-dtype", "float32")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "into a PARD draft of 3 depths, mask token 3" in err
    record = json.loads((out / "training.json").read_text())
    config = AutoConfig.from_pretrained(out)
    assert config.pard_token == MASK and config.spd_type == "pard"
    first = [float(x) for x in err.split("top-1 ")[1].split()[:3]]
    last = record["heldout_accuracy_per_depth"]
    assert last[1] > first[1] + 0.2 and last[2] > first[2] + 0.2, (first, last)

    target = files["target"]
    prompts = [{"prompt_token_ids": target.encode(t)} for t in ("the cat sat on", "hello world one two", "big red")]
    params = SamplingParams(max_tokens=16)
    with LLM(target.model, None, tokenizer=target.tokenizer) as plain:
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    accepted = {}
    for name, draft in (("before", files["untrained"]), ("after", str(out))):
        config = fixed_draft_len(DraftTargetDecodingConfig(max_draft_len=3, speculative_model=draft))
        with LLM(target.model, config, tokenizer=target.tokenizer) as spec:
            assert spec.engine.resource_manager.drafter.mask_token == MASK
            assert [o.token_ids for o in spec.generate(prompts, params)] == expected
            accepted[name] = spec.get_metrics().num_accepted_tokens_per_pos
    assert sum(accepted["after"][1:]) > sum(accepted["before"][1:])


@pytest.mark.parametrize(("extra", "message"), [
    (["--depths", "0"], "--depths: must be at least 1"),
    (["--mask-token", "100000"], "--mask-token: 100000 is not a token id of the draft"),
])
def test_bad_options_are_one_line(files: dict, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(train(files, files["dir"] / "bad", *extra))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert message in err, err


def test_a_draft_that_is_not_pard_needs_a_mask_token(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(files, files["dir"] / "nomask", mask=False)) == 2
    assert "--mask-token: required" in capsys.readouterr().err


def test_shipped_form_assembles_into_the_pard_draft(tmp_path: Path) -> None:
    """The shipped form (trained layers, norm, the mask token's embedding; pard_token in the
    metadata) plus the target's embedding assembles into the exported PARD checkpoint's draft,
    and `specdec train draft --init` can continue from it."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from specdec.testing import make_tiny_target
    from specdec_draft_target.shipped import PARD_EMBEDDING, assemble_draft
    from specdec_draft_target.train_pard import SHIPPED_FORM, export

    tiny = make_tiny_target(seed=3, num_layers=3)
    tiny.model.config.tie_word_embeddings = True
    target = type(tiny.model)(tiny.model.config).eval()
    target_dir = save(target, tiny.tokenizer, tmp_path / "target")
    module = PardDraft(build_draft(target, [0, 2]), MASK)
    with torch.no_grad():
        module.mask_embedding.add_(1.0)
    meta = {"format": "pt", "num_hidden_layers": "2", "source_layers": "0,2"}
    export(module, tiny.tokenizer, tmp_path / "pard", torch.bfloat16, meta, 7, None)
    with safe_open(str(tmp_path / "pard" / SHIPPED_FORM), "pt") as f:
        assert f.metadata()["pard_token"] == str(MASK) and f.metadata()["pard_steps"] == "7"
        assert PARD_EMBEDDING in f.keys()
    assemble_draft(tmp_path / "pard" / SHIPPED_FORM, target_dir, tmp_path / "assembled")
    assembled = AutoModelForCausalLM.from_pretrained(tmp_path / "assembled").eval()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "pard", dtype=torch.float32).eval()
    assert assembled.config.pard_token == exported.config.pard_token == MASK
    row = assembled.get_input_embeddings().weight[MASK]
    torch.testing.assert_close(row, module.mask_embedding.detach().to(torch.bfloat16).float())
    ids = torch.tensor([[5, 6, 7, MASK, MASK]])
    with torch.no_grad():
        torch.testing.assert_close(assembled(ids).logits, exported(ids).logits, atol=0.05, rtol=0.05)
    # `specdec train draft --init` continues it as an autoregressive draft (the mask embedding left out).
    from specdec_draft_target.train import load_trained
    load_trained(build_draft(target, [0, 2]), tmp_path / "pard" / SHIPPED_FORM, [0, 2])
