"""`specdec synthesize` / specdec.training.synthesize: the target's own greedy replies, batched,
appended and resumable; bad input files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec import LLM, ConfigError, SamplingParams
from specdec.cli.main import main
from specdec.testing import TinyTarget, make_tiny_target, tiny_tokenizer
from specdec.training.conversations import chat_token_ids
from specdec.training.synthesize import (SynthesisOptions, pick_opener, read_conversations, read_openers,
                                         self_prompt_records, synthesize, turn_seed, user_turn_prefix)

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


@pytest.mark.parametrize("suffix", [".xz", ".gz", ".bz2"])
def test_compressed_conversations_read_as_plain(tmp_path: Path, suffix: str) -> None:
    """A data set kept compressed reads exactly as its plain file; a damaged one is a one-line error."""
    import bz2
    import gzip
    import lzma

    compress = {".xz": lzma.compress, ".gz": gzip.compress, ".bz2": bz2.compress}[suffix]
    plain = write_prompts(tmp_path / "plain.jsonl")
    packed = tmp_path / f"packed.jsonl{suffix}"
    packed.write_bytes(compress(plain.read_bytes()))
    assert read_conversations(packed) == read_conversations(plain)
    damaged = tmp_path / f"damaged.jsonl{suffix}"
    damaged.write_bytes(compress(plain.read_bytes())[:-12])
    with pytest.raises(ConfigError, match="damaged.jsonl"):
        read_conversations(damaged)


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
    assert "batch_size, max_new_tokens and user_max_tokens must be at least 1" in err and "missing.jsonl" in err


def test_every_user_turn_is_answered_by_the_target(tmp_path: Path) -> None:
    """A two-turn conversation: the input's assistant turn is dropped, the target answers turn 1,
    then turn 2 after its own first reply, each reply exactly plain greedy decoding of the same
    messages; the system prompt replaces the input's. A reply cut by max_new_tokens ends the
    conversation."""
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


def chatty_target(seed: int = 0) -> TinyTarget:
    """A tiny target whose turns end by themselves: its output layer gets a bias towards the end
    of sequence, so sampled turns stop after a few tokens instead of running to the cap."""
    tiny = make_tiny_target(seed=seed)
    head = tiny.model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[tiny.tokenizer.eos_token_id] = 2.0
    tiny.model.lm_head = biased
    return tiny


def test_user_turn_prefix_opens_a_user_turn_through_the_template() -> None:
    """The prefix is the template's rendering of a user turn up to where its content starts, after
    any earlier messages; a template that rewrites the content is refused with the reason."""
    tokenizer = tiny_tokenizer()
    earlier = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for messages in ([], earlier):
        prefix = user_turn_prefix(tokenizer, messages)
        rendered = chat_token_ids(tokenizer, [*messages, {"role": "user", "content": "abc"}], False)
        assert rendered[: len(prefix)] == prefix
        assert tokenizer.decode(rendered[len(prefix):]).startswith("abc")
    assert tokenizer.decode(user_turn_prefix(tokenizer, earlier)) == "user: hi\nassistant: hello\nuser: "
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(ConfigError, match="does not write a user turn's content verbatim"):
        user_turn_prefix(tokenizer, [])


def test_the_target_writes_user_turns_and_follow_ups(tmp_path: Path) -> None:
    """Magpie-style synthesis: a conversation with no user turn gets its opening request sampled by
    the target from the opened user turn, with the turn's own seed; with follow_ups=1 a
    conversation, a given prompt's included, gets one more request written by the target after
    its reply, then answered. A request that comes out empty ends its conversation (one with no
    reply is not written). Requests differ across conversations, and the run is reproducible."""
    tiny = chatty_target()
    options = SynthesisOptions(max_new_tokens=60, batch_size=3, temperature=1.0, follow_ups=1,
                               user_temperature=1.0, user_top_p=1.0, user_max_tokens=60, seed=7)
    records = [*self_prompt_records(8, seed=7),
               {"conversation_id": "given", "conversations": [{"role": "user", "content": "hello there"}]}]
    out = tmp_path / "out.jsonl"
    written = synthesize(tiny.model, tiny.tokenizer, records, out, options)
    rows = {r["conversation_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(rows) == written
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    for cid, row in rows.items():
        turns = row["conversations"]
        assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"][: len(turns)], cid
        assert len(turns) in (2, 4)
        for index in range(0, len(turns), 2):
            if cid == "given" and index == 0:
                assert turns[0]["content"] == "hello there"
            else:
                prefix = user_turn_prefix(tiny.tokenizer, turns[:index])
                request = plain.generate([{"prompt_token_ids": prefix}], SamplingParams(
                    max_tokens=60, temperature=1.0, seed=turn_seed(7, cid, f"user{index // 2}")))[0]
                assert request.finish_reason == "stop" and turns[index]["content"] == request.text.strip()
            reply = plain.generate([turns[: index + 1]], SamplingParams(
                max_tokens=60, temperature=1.0, seed=turn_seed(7, cid, str(index // 2))))[0]
            assert turns[index + 1]["content"] == reply.text
    # Most turns end by themselves with this target; the seeds are fixed, so these counts are too.
    assert "given" in rows and written >= 6
    assert sum(len(row["conversations"]) == 4 for row in rows.values()) >= 3
    openings = [row["conversations"][0]["content"] for cid, row in rows.items() if cid != "given"]
    assert len(set(openings)) == len(openings)
    assert all(row["source"] == "self-prompt" for cid, row in rows.items() if cid != "given")

    again = tmp_path / "again.jsonl"
    synthesize(tiny.model, tiny.tokenizer, records, again, options)
    assert sorted(again.read_text().splitlines()) == sorted(out.read_text().splitlines())


def test_openers_start_the_requests_the_target_writes(tmp_path: Path) -> None:
    """With openers, each request the target writes begins with one, picked by the turn's seed
    (opening requests from `openers`, follow-ups from `follow_up_openers`), and the rest is the
    target's own sampled continuation of its opened user turn followed by the opener's tokens.
    A given prompt is left as it is."""
    tiny = chatty_target()
    options = SynthesisOptions(max_new_tokens=40, batch_size=3, temperature=1.0, follow_ups=1, user_top_p=1.0,
                               user_max_tokens=60, seed=3, openers=("write a", "imagine"), follow_up_openers=("now",))
    records = [*self_prompt_records(8, seed=3),
               {"conversation_id": "given", "conversations": [{"role": "user", "content": "hello there"}]}]
    out = tmp_path / "out.jsonl"
    synthesize(tiny.model, tiny.tokenizer, records, out, options)
    rows = {r["conversation_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    used, follow_ups = set(), 0
    for cid, row in rows.items():
        turns = row["conversations"]
        for index in range(0, len(turns), 2):
            if cid == "given" and index == 0:
                assert turns[0]["content"] == "hello there"
                continue
            turn = f"user{index // 2}"
            opener = pick_opener(options.follow_up_openers if index else options.openers, 3, cid, turn)
            assert opener in (("now",) if index else ("write a", "imagine"))
            prefix = user_turn_prefix(tiny.tokenizer, turns[:index]) + tiny.encode(opener)
            rest = plain.generate([{"prompt_token_ids": prefix}], SamplingParams(
                max_tokens=60, temperature=1.0, seed=turn_seed(3, cid, turn)))[0]
            assert turns[index]["content"] == (opener + rest.text).strip(), (cid, index)
            used.add(opener)
            follow_ups += index > 0
    assert used == {"write a", "imagine", "now"} and follow_ups >= 2


def test_cli_openers_file(tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--openers` reads one opener a line, comments and blank lines skipped; a file with none,
    or none at all, is a one-line error naming the option."""
    listed = tmp_path / "openers.txt"
    listed.write_text("# kinds of request\nwrite a\n\n  imagine  \n")
    assert read_openers(listed, "--openers") == ("write a", "imagine")
    model_dir = tmp_path / "tiny"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out.jsonl"
    args = ["synthesize", "--model", str(model_dir), "--dtype", "float32", "--output", str(out), "--self-prompts", "2"]
    (tmp_path / "empty.txt").write_text("# nothing\n")
    assert main([*args, "--openers", str(tmp_path / "empty.txt")]) == 2
    assert main([*args, "--follow-up-openers", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert "--openers" in err and "no opener in it" in err and "--follow-up-openers" in err and "missing.txt" in err
    assert not out.exists()


def test_a_request_cut_off_ends_its_conversation(tmp_path: Path) -> None:
    """A user turn the target does not finish within user_max_tokens is dropped: a conversation
    with nothing answered is not written, one with replies keeps them and ends there."""
    tiny = make_tiny_target(seed=0)  # no bias: turns rarely end within 3 tokens
    records = [*self_prompt_records(2, seed=0),
               {"conversation_id": "given", "conversations": [{"role": "user", "content": "hi"}]}]
    out = tmp_path / "out.jsonl"
    options = SynthesisOptions(max_new_tokens=3, follow_ups=1, user_max_tokens=3, batch_size=4)
    # The given prompt's reply is cut by max_new_tokens too, so it ends before its follow-up.
    assert synthesize(tiny.model, tiny.tokenizer, records, out, options) == 1
    assert [t["role"] for t in json.loads(out.read_text())["conversations"]] == ["user", "assistant"]
    with pytest.raises(ConfigError, match="user_temperature must be > 0"):
        synthesize(tiny.model, tiny.tokenizer, records, out, SynthesisOptions(user_temperature=0.0))


def test_cli_self_prompts_need_no_input(tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = tmp_path / "tiny"
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out.jsonl"
    assert main(["synthesize", "--model", str(model_dir), "--dtype", "float32", "--output", str(out)]) == 2
    assert "give --input" in capsys.readouterr().err
    assert main(["synthesize", "--model", str(model_dir), "--dtype", "float32", "--output", str(out),
                 "--self-prompts", "3", "--user-max-tokens", "200", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().err.count("wrote") == 1
