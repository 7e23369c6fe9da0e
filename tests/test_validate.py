"""`specdec validate`: acceptance per category and overall, from Spec-Bench files (multi-turn) and
conversations files, with the metrics' own definitions."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from specdec import LLM
from specdec.cli.main import main
from specdec.cli.validate import load_prompt_set, run_validation
from specdec.testing import make_tiny_target

QUESTIONS = [
    {"question_id": 1, "category": "echo", "turns": ["the cat sat on the mat. the cat sat", "again: the cat sat"]},
    {"question_id": 2, "category": "echo", "turns": ["one two three one two three one two"]},
    {"question_id": 3, "category": "words", "turns": ["hello world hello world hello"]},
]


@pytest.fixture()
def spec_bench_file(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_prompt_sets_from_both_formats(spec_bench_file: Path, tmp_path: Path) -> None:
    """Spec-Bench files give their turns; conversations files, plain or compressed as the kept
    training data is, give the conversation up to its last user turn."""
    assert load_prompt_set(str(spec_bench_file), None, None, 2)[0] == ("echo", QUESTIONS[0]["turns"])
    assert load_prompt_set(str(spec_bench_file), ["words"], None, 1) == [("words", QUESTIONS[2]["turns"])]
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}, {"role": "user", "content": "more"}]
    row = json.dumps({"conversation_id": "a", "category": "chat", "conversations": turns}) + "\n"
    plain = tmp_path / "conv.jsonl"
    plain.write_text(row)
    compressed = tmp_path / "conv.jsonl.xz"
    compressed.write_bytes(lzma.compress(row.encode()))
    for conversations in (plain, compressed):
        assert load_prompt_set(str(conversations), None, None, 1) == [("chat", turns)]


def test_every_turn_is_asked_after_the_models_own_answers(spec_bench_file: Path) -> None:
    """Turn 2 carries turn 1's generated answer; each answered turn adds one metrics record."""
    target = make_tiny_target()
    seen = []
    with LLM(target.model, {"method": "ngram", "num_speculative_tokens": 3}, tokenizer=target.tokenizer) as llm:
        original = llm.generate
        llm.generate = lambda prompts, params, chat: seen.append([list(p) for p in prompts]) or original(prompts, params, chat=chat)
        answered = run_validation(llm, load_prompt_set(str(spec_bench_file), None, None, 2), 16)
    assert {c: len(m) for c, m in answered.items()} == {"echo": 3, "words": 1}
    assert [len(batch) for batch in seen] == [3, 1]
    second = seen[1][0]
    assert [t["role"] for t in second] == ["user", "assistant", "user"] and second[2]["content"] == "again: the cat sat"


def test_cli_table_and_json(tiny_dir: Path, spec_bench_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ar.json"
    code = main(["validate", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram", "--max-draft-len", "3",
                 "--dataset", str(spec_bench_file), "--max-turns", "2", "--max-tokens", "24", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "echo" in printed and "words" in printed and "overall" in printed
    report = json.loads(out.read_text())
    assert report["method"] == "ngram" and set(report["categories"]) == {"echo", "words"}
    assert report["categories"]["echo"]["turns"] == 3 and report["overall"]["turns"] == 4
    overall = report["overall"]
    assert overall["num_drafts"] == sum(c["num_drafts"] for c in report["categories"].values()) > 0
    assert overall["mean_acceptance_length"] == pytest.approx(1 + overall["num_accepted_tokens"] / overall["num_drafts"])


@pytest.mark.parametrize(("args", "message"), [
    (["validate"], "validate needs --config or --method"),
    (["validate", "--method", "ngram", "--dataset", "missing.jsonl"], "--dataset: cannot read 'missing.jsonl'"),
    (["validate", "--method", "ngram", "--categories", "nope"], "--categories: unknown nope"),
])
def test_bad_input_is_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
