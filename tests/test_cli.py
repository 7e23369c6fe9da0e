"""The `specdec` command line, run as a real subprocess against a tiny model saved to disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from specdec.cli.main import main


def specdec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def test_list_methods_json_has_required_fields() -> None:
    """`list-methods --json` lists the core methods and the n-gram plugin with their distributions."""
    result = specdec("list-methods", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"none", "user_provided", "ngram"} <= set(rows)
    for row in rows.values():
        assert {"name", "aliases", "distribution", "version"} <= set(row)
    assert rows["ngram"]["distribution"] == "specdec-plugin-ngram"
    assert "max_matching_ngram_size" in rows["ngram"]["options"]


def test_generate_json_lines(tiny_dir: Path) -> None:
    """`generate --json` prints one object per prompt with text, token ids and the metrics."""
    result = specdec("generate", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram",
                     "--max-draft-len", "3", "--set", "prompt_lookup_max=2", "--no-chat", "--max-tokens", "20",
                     "--json", "hello world, hello", "abc abc ab")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert len(line["token_ids"]) == 20 and isinstance(line["text"], str)
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length",
                    "acceptance_rate", "tokens_per_second"):
            assert key in line["metrics"]


def test_generate_with_a_tiny_temperature_decodes_greedily(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--temperature 1e-40` decodes greedily (below 1e-5, as vLLM does) instead of a traceback."""
    common = ["generate", "--model", str(tiny_dir), "--dtype", "float32", "--no-chat", "--max-tokens", "12", "--json"]
    outputs = []
    for temperature in ("1e-40", "0"):
        assert main([*common, "--temperature", temperature, "hello world, hello"]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1]


def test_generate_samples_with_min_p(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--min-p` reaches the sampler: the seeded output is the library's with the same min_p (in
    process: what is checked is the option's way to the sampler)."""
    from specdec import LLM, SamplingParams

    assert main(["generate", "--model", str(tiny_dir), "--dtype", "float32", "--no-chat", "--max-tokens", "12",
                 "--json", "--temperature", "1", "--seed", "3", "--min-p", "0.5", "hello world, hello"]) == 0
    with LLM(str(tiny_dir), dtype="float32") as llm:
        params = SamplingParams(temperature=1.0, seed=3, min_p=0.5, max_tokens=12)
        expected = llm.generate("hello world, hello", params)[0].token_ids
        without = llm.generate("hello world, hello", params.model_copy(update={"min_p": 0.0}))[0].token_ids
    assert json.loads(capsys.readouterr().out)["token_ids"] == expected != without


def test_generate_compare_matches_plain(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --compare` reports a speedup measured against plain decoding and the same tokens."""
    assert main(["generate", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram", "--compare",
                 "--no-chat", "--max-tokens", "30", "--json", "hello world, hello"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["speedup"] > 0 and line["matches_plain"] is True


@pytest.mark.parametrize(("flags", "cached"), [([], [0, 512]), (["--no-enable-prefix-caching"], [0, 0])])
def test_generate_reuses_a_prompt_prefill_unless_told_not_to(tiny_dir: Path, capsys: pytest.CaptureFixture[str],
                                                            flags: list[str], cached: list[int]) -> None:
    """The second of two 600-token prompts takes its first two blocks from the prefix cache (its
    metrics count them), and gives the same text; ``--no-enable-prefix-caching`` turns that off."""
    prompt = "one two three four " * 32
    assert main(["generate", "--model", str(tiny_dir), "--dtype", "float32", "--no-chat", "--max-tokens", "8", "--json",
                 *flags, prompt, prompt]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["metrics"]["num_cached_tokens"] for line in lines] == cached
    assert lines[0]["text"] == lines[1]["text"]


def test_generate_from_trtllm_yaml(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TensorRT-LLM style YAML file configures the method."""
    config = tmp_path / "spec.yaml"
    config.write_text("speculative_config:\n  decoding_type: NGram\n  max_draft_len: 2\n  max_matching_ngram_size: 2\n")
    assert main(["generate", "--model", str(tiny_dir), "--config", str(config), "--no-chat",
                 "--max-tokens", "10", "--json", "hello hello"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "ngram"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--method", "nosuch", "x"], "installed: "),
        (["generate", "--method", "ngram", "--max-draft-len", "0", "x"], "max_draft_len"),
        (["generate", "--method", "ngram", "--set", "is_keep_al=1", "x"], "is_keep_al"),
        (["generate", "--temperature", "-1", "x"], "temperature"),
        (["generate", "--config", "/nonexistent.yaml", "x"], "/nonexistent.yaml"),
        (["generate", "--model", "/nonexistent-model", "x"], "/nonexistent-model"),
        (["bench", "--method", "ngram", "--baseline", "vllm"], "--baseline"),
        (["bench", "--method", "ngram", "--categories", "poetry"], "poetry"),
        (["nosuchcommand"], "nosuchcommand"),
        (["generate", "--stop", "", "x"], "stop"),
        (["generate", "--method", "ngram", "--set", "method=1", "x"], "method"),
        (["generate", "--device", "tpu9", "x"], "device"),
        (["bench", "--method", "ngram", "--max-turns", "0"], "--max-turns"),
        (["generate", "--enforce-eager", "--compile", "x"], "--enforce-eager and --compile"),
        (["generate", "--max-model-len", "1", "x"], "--max-model-len"),
        (["generate", "--prefix-cache-gib", "0", "x"], "--prefix-cache-gib"),
        (["generate", "--chat-template", "nosuch.jinja", "x"], "chat_template"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input gives exit code 2 and a one-line error naming the problem, never a traceback.

    Runs the CLI's entry function in-process (a subprocess per case would only add start-up time).
    """
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err


def test_a_model_that_cannot_load_is_one_whole_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' multi-line reason (here: no tokenizer beside a config) comes on the error's one
    line, whole."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises((OSError, ValueError)) as raised:
        AutoTokenizer.from_pretrained(tmp_path)
    assert len(str(raised.value).splitlines()) > 1  # what the test is about
    reason = " ".join(str(raised.value).split())
    test_bad_input_is_one_line_and_exit_2(["generate", "--model", str(tmp_path), "x"], reason, capsys)


def test_bad_input_from_a_real_process() -> None:
    """The installed entry point turns a bad config into exit code 2 and one line, no traceback."""
    result = specdec("generate", "--method", "nosuch", "x")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: unknown speculative method 'nosuch'; installed: ")


def test_bench_writes_summary_json_and_plot(tiny_dir: Path, tmp_path: Path) -> None:
    """`bench` runs plain, speculative, transformers' peer and its static-cache plain decoding,
    and writes the summary and a plot."""
    data = tmp_path / "prompts.jsonl"
    rows = [{"question_id": i, "category": cat, "turns": [text, "again"]}
            for i, (cat, text) in enumerate([("a", "hello world, hello"), ("b", "abc abc ab"), ("b", "one two one")])]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "bench.json"
    result = specdec("bench", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram", "--dataset", str(data),
                     "--max-tokens", "16", "--baseline", "none,hf,hf-static,eager", "--json", str(out),
                     # A fixed draft length: the adaptive one may stop drafting on a busy machine.
                     "--set", "adaptive_draft_len=false")
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) == {"a", "b", "overall"}
    for key in ("speedup", "speedup_vs_hf", "speedup_vs_hf_static", "mean_accepted_tokens", "acceptance_rate", "outputs_match"):
        assert summary["overall"][key] is not None
    assert summary["overall"]["outputs_match"] == 1.0
    if torch.cuda.is_available():
        # The CLI decodes on CUDA here, with captured forwards: the eager baseline is timed.
        assert summary["overall"]["speedup_vs_eager"] is not None
    else:
        # On the CPU plain decoding is already eager: the eager baseline would time the same thing.
        assert "skipping the eager baseline" in " ".join(result.stdout.split()) and "speedup_vs_eager" not in summary["overall"]
    # Per-position acceptance never rises with the position: accepting position i needs i - 1 first.
    per_pos = summary["overall"]["acceptance_rate_per_pos"]
    assert per_pos and all(1 >= a >= b >= 0 for a, b in zip(per_pos, per_pos[1:] + [0]))
    assert "by position" in result.stdout
    # n-gram speculation is lossless: no lossy-accepted tokens, and no column for them.
    assert summary["overall"]["num_lossy_accepted_tokens"] == 0 and "lossy acc." not in result.stdout
    assert summary["b"]["num_turns"] == 4
    # Each turn is timed alone: 4 timed runs in "b", so its speedup gets an interval around it.
    low, high = summary["b"]["speedup_ci95"]
    assert summary["b"]["num_timed_runs"] == 4 and low <= summary["b"]["speedup"] <= high
    assert out.with_suffix(".png").stat().st_size > 0
    # Where the step's time goes: forward costs by width, per-step parts, their own plot.
    costs = json.loads(out.read_text())["costs"]
    assert set(costs["steps"]) == {"a", "b", "overall"} and len(costs["forward_cost"]["relative"][0]) == 5
    assert "where a step's time goes" in result.stdout and (tmp_path / "bench-costs.png").stat().st_size > 0


def test_bench_batch_size_compares_batched_throughput(tiny_dir: Path, tmp_path: Path) -> None:
    """`bench --batch-size 2` decodes each category's prompts two at a time in both modes, skips
    transformers' one-sequence peer with a note, and every batched output equals plain's;
    `--repeats 2` runs each batch twice in both modes and keeps both rounds."""
    data = tmp_path / "prompts.jsonl"
    rows = [{"question_id": i, "category": cat, "turns": [text, "again"]}
            for i, (cat, text) in enumerate([("a", "hello world, hello"), ("b", "abc abc ab"), ("b", "one two one"), ("b", "xy xy x")])]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "bench.json"
    result = specdec("bench", "--model", str(tiny_dir), "--dtype", "float32", "--method", "ngram", "--dataset", str(data),
                     "--max-tokens", "16", "--baseline", "none,hf", "--batch-size", "2", "--repeats", "2", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "skipping the hf baseline" in " ".join(result.stdout.split())
    payload = json.loads(out.read_text())
    assert payload["batch_size"] == 2
    summary = payload["summary"]
    assert summary["b"]["num_turns"] == 6 and summary["overall"]["outputs_match"] == 1.0
    assert summary["b"]["num_rounds"] == 12
    assert sorted(t["round"] for t in payload["turns"] if t["question_id"] == "1") == [0, 0, 1, 1]
    # Requests of one batch share a timing: "b" is 2 batches per turn, 2 turns, 2 rounds.
    assert summary["b"]["num_timed_runs"] == 8
    low, high = summary["overall"]["speedup_ci95"]
    assert low <= summary["overall"]["speedup"] <= high
    assert summary["overall"]["speedup"] > 0 and "speedup_vs_hf" not in summary["overall"]


def test_bench_ignore_eos_generates_max_tokens_in_every_mode(tmp_path: Path) -> None:
    """With a token the model generates early made an EOS, every mode stops there; with
    `--ignore-eos`, plain, speculative and transformers' decoding all generate exactly
    `--max-tokens`, so outputs that differ cannot differ in length."""
    from specdec.testing import make_tiny_target

    target = make_tiny_target()
    prompt = "hello world, hello"
    with torch.no_grad():
        early = int(target.model(torch.tensor([target.encode(prompt)])).logits[0, -1].argmax())
    target.model.generation_config.eos_token_id = early
    model_dir = tmp_path / "model"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "a", "turns": [prompt]}))
    lengths = {}
    for flags in ((), ("--ignore-eos",)):
        out = tmp_path / f"bench{len(flags)}.json"
        result = specdec("bench", "--model", str(model_dir), "--dtype", "float32", "--method", "ngram", "--dataset",
                         str(data), "--max-tokens", "12", "--baseline", "none,hf", *flags, "--json", str(out))
        assert result.returncode == 0, result.stderr
        payload = json.loads(out.read_text())
        assert payload["sampling"]["ignore_eos"] == bool(flags)
        lengths[flags] = {mode: run["num_tokens"] for mode, run in payload["turns"][0]["runs"].items()}
    # The chat template comes first, so the EOS comes a few tokens in; each mode stops there.
    assert set(lengths[()]) == {"plain", "spec", "hf"} and len(set(lengths[()].values())) == 1
    assert lengths[()]["plain"] < 12
    assert lengths[("--ignore-eos",)] == dict.fromkeys(("plain", "spec", "hf"), 12)


def test_list_methods_reports_installed_and_broken_plugins(installed_plugins: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pip-installed plugin is listed with its distribution and version; a plugin that fails to
    import is listed with its error, and the command still succeeds."""
    assert main(["list-methods", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert (rows["echo"]["distribution"], rows["echo"]["version"], rows["echo"]["status"]) == (
        "specdec-plugin-echo-example", "0.3.0", "ok")
    assert rows["broken"]["status"] == "error" and "ModuleNotFoundError" in rows["broken"]["error"]
    assert rows["ngram"]["status"] == "ok"
    assert main(["list-methods"]) == 0
    table = capsys.readouterr().out
    # The table wraps long cells at word boundaries on an 80-column capture.
    assert "failed" in table and "broken" in table and "echo" in table


def test_a_failing_plugin_is_one_line_and_exit_2(plugins_env: dict[str, str], tiny_dir: Path, tiny) -> None:
    """A pip-installed plugin whose drafter raises during generation: the command prints one
    error line naming the method and the exception, no traceback, and exits with 2. (The draft
    length is fixed: the adaptive one may, on a busy machine, decide not to draft at all.)"""
    bad = tiny.encode("h")[0]
    result = specdec("generate", "--model", str(tiny_dir), "--dtype", "float32", "--method", "echo",
                     "--set", f"fail_on_token={bad}", "--set", "adaptive_draft_len=false", "--no-chat",
                     "--max-tokens", "8", "hello",
                     env=plugins_env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "echo" in lines[0] and "RuntimeError" in lines[0]
