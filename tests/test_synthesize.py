"""`specdec synthesize` / specdec.training.synthesize: the target's own greedy replies, batched,
appended and resumable; bad input files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec import LLM, ConfigError, SamplingParams
from specdec.cli.main import main
from specdec.training.synthesize import SynthesisOptions, read_conversations, synthesize

PROMPTS = ["hello there", "the cat sat on the mat", "one two three", "abc abd abe", "good day, how are you"]


def write_prompts(path: Path, prompts: list[str] = PROMPTS) -> Path:
    with path.open("w") as f:
        for i, text in enumerate(prompts):
            f.write(json.dumps({"conversation_id": f"c{i}", "source": "test",
                                "conversations": [{"role": "user", "content": text}]}) + "\n")
    return path


def test_replies_are_the_targets_greedy_output(tiny, tmp_path: Path) -> None:
    """Batched, left-padded generation gives each prompt exactly its own plain greedy reply (fp32)."""
    out = tmp_path / "out.jsonl"
    written = synthesize(tiny.model, tiny.tokenizer, read_conversations(write_prompts(tmp_path / "in.jsonl")), out,
                         SynthesisOptions(max_new_tokens=12, batch_size=2))
    assert written == len(PROMPTS)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["conversation_id"] for r in rows) == [f"c{i}" for i in range(len(PROMPTS))]
    for row in rows:
        user, reply = row["conversations"]
        assert row["source"] == "test" and reply["role"] == "assistant"
        expected = plain.generate([{"role": "user", "content": user["content"]}], SamplingParams(max_tokens=12))[0]
        assert reply["content"] == expected.text


def test_resume_skips_done_conversations(tiny, tmp_path: Path) -> None:
    src = write_prompts(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    options = SynthesisOptions(max_new_tokens=4, batch_size=4)
    assert synthesize(tiny.model, tiny.tokenizer, read_conversations(src)[:2], out, options) == 2
    assert synthesize(tiny.model, tiny.tokenizer, read_conversations(src), out, options) == len(PROMPTS) - 2
    ids = [json.loads(line)["conversation_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == len(PROMPTS)


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "not valid JSON"),
    ('{"conversations": []}', "expected an object with 'conversation_id'"),
    ('{"conversation_id": 1, "conversations": [{"role": "user"}]}', "each turn needs a role"),
    ('{"conversation_id": 1, "conversations": [{"role": "assistant", "content": "x"}]}', "no user turn"),
])
def test_bad_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        read_conversations(path)
    assert f"{path}:1" in str(info.value)


def test_cli_writes_the_sample_and_rejects_bad_input(tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = tmp_path / "tiny"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    src, out = write_prompts(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    args = ["synthesize", "--model", str(model_dir), "--dtype", "float32", "--input", str(src), "--output", str(out),
            "--limit", "3", "--max-new-tokens", "4", "--batch-size", "2"]
    assert main(args) == 0
    assert len(out.read_text().splitlines()) == 3
    assert main([*args[:-2], "--batch-size", "0"]) == 2
    assert main(["synthesize", "--input", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "batch_size and max_new_tokens must be at least 1" in err and "missing.jsonl" in err


def test_every_user_turn_is_answered_by_the_target(tmp_path: Path) -> None:
    """A two-turn conversation: the input's assistant turn is dropped, the target answers turn 1,
    then turn 2 after its own first reply, each reply exactly plain greedy decoding of the same
    messages; the system prompt replaces the input's. A reply cut by max_new_tokens ends the
    conversation."""
    import torch

    from specdec.testing import make_tiny_target

    tiny = make_tiny_target(seed=0)
    system = {"role": "system", "content": "be brief"}
    first = [system, {"role": "user", "content": "hello there"}]
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    reply = plain.generate([first], SamplingParams(max_tokens=8))[0].token_ids
    # Make the tiny model stop where it would have said reply[2]: the end-of-sequence row becomes
    # that token's, scaled up, so the first reply ends after two tokens instead of being cut.
    stop_at = reply[2]
    assert stop_at not in reply[:2]
    with torch.no_grad():
        tiny.model.lm_head.weight[2] = 1.5 * tiny.model.lm_head.weight[stop_at]

    record = {"conversation_id": "m", "conversations": [
        {"role": "system", "content": "ignored"}, {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "another model's words"}, {"role": "user", "content": "and then?"}]}
    out = tmp_path / "out.jsonl"
    options = SynthesisOptions(max_new_tokens=8, batch_size=2, system_prompt="be brief")
    assert synthesize(tiny.model, tiny.tokenizer, [record], out, options) == 1
    turns = json.loads(out.read_text())["conversations"]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user", "assistant"]
    assert turns[0] == system and "another model's words" not in json.dumps(turns)
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    answer = plain.generate([first], SamplingParams(max_tokens=8))[0]
    assert answer.finish_reason == "stop" and len(answer.token_ids) == 2
    assert turns[2]["content"] == answer.text
    second = plain.generate([turns[:4]], SamplingParams(max_tokens=8))[0]
    assert turns[4]["content"] == second.text

    # Without the early stop every reply runs to max_new_tokens: the first one ends the conversation.
    cut = tmp_path / "cut.jsonl"
    assert synthesize(make_tiny_target(seed=0).model, tiny.tokenizer, [record], cut, options) == 1
    assert [t["role"] for t in json.loads(cut.read_text())["conversations"]] == ["system", "user", "assistant"]
