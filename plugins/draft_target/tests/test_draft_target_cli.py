"""`specdec generate --method draft_target --speculative-model DIR` and `specdec train draft`, as
real subprocesses against tiny models saved to disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specdec import LLM, SamplingParams


def specdec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdec.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_generate_with_a_draft_model_matches_plain(tiny, target_dir: Path, small_draft_dir: Path) -> None:
    """The CLI selects the method and the draft; greedy output equals plain greedy decoding."""
    prompt = "the cat sat on the mat. the cat"
    result = specdec("generate", "--model", str(target_dir), "--dtype", "float32", "--method", "draft_target",
                     "--speculative-model", str(small_draft_dir), "--max-draft-len", "3", "--no-chat",
                     "--max-tokens", "24", "--json", prompt)
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout)
    assert line["method"] == "draft_target" and line["metrics"]["num_drafts"] > 0
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, SamplingParams(max_tokens=24))[0]
    assert line["token_ids"] == plain.token_ids


def test_mismatched_draft_is_one_line_exit_2(target_dir: Path, mismatched_draft_dir: Path) -> None:
    result = specdec("generate", "--model", str(target_dir), "--method", "DraftTarget", "--speculative-model",
                     str(mismatched_draft_dir), "--no-chat", "hello")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "tokenizer differs from the target's" in result.stderr


def test_train_group_lists_the_plugin_command() -> None:
    """`specdec train` gathers commands from plugins through specdec_train_commands."""
    result = specdec("train", "--help")
    assert result.returncode == 0, result.stderr
    assert "draft" in result.stdout and "Distil a small draft" in result.stdout
