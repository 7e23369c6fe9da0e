"""The conversations kept in training-data/ read as the training commands read them, and none of
them holds an evaluation prompt: drafters trained on them are measured on Spec-Bench and HumanEval."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdec.bench.dataset import load_questions
from specdec.training.synthesize import read_conversations

DATA = Path(__file__).resolve().parent.parent / "training-data"
FILES = sorted(DATA.glob("*/*.jsonl*"))


def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def test_there_is_data_to_check():
    assert FILES, f"no conversations files under {DATA}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_kept_conversations_hold_no_evaluation_prompt(path: Path):
    """No user turn equals or contains an evaluation prompt's turn, whitespace and case aside, and
    every file is listed in its folder's README."""
    evaluation = {normalized(t) for name in ("spec_bench", "humaneval") for q in load_questions(name) for t in q.turns}
    records = read_conversations(path)
    assert records
    turns = [normalized(t["content"]) for r in records for t in r["conversations"] if t["role"] == "user"]
    assert not [t for t in turns if t in evaluation]
    long_prompts = [e for e in evaluation if len(e) >= 40]
    assert not [t for t in turns if any(e in t for e in long_prompts)]
    assert f"`{path.name}`" in (path.parent / "README.md").read_text()
