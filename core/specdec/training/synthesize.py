"""Data synthesis: the target answers training prompts itself, so a drafter learns *its* outputs.

Input and output are conversations jsonl in the format of TensorRT Model Optimizer's speculative
training recipes: one object per line with ``conversation_id`` and ``conversations`` (a list of
``{"role", "content"}``). For each input conversation the target generates the reply to its last
user turn (any later assistant turn is replaced), and the output line carries the conversation
with that reply appended plus the input's other fields.

Generation runs on specdec's own engine with continuous batching (a finished reply leaves the
batch and the next prompt joins, so no row waits for the longest reply in its batch) and is greedy
unless a temperature is given. The output is appended to and flushed after every chunk of
prompts; conversations whose id is already in it are skipped, so an interrupted run resumes
where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import ConfigError
from specdec.llm import LLM
from specdec.sampling import SamplingParams

_ROLES = {"system", "user", "assistant"}
#: Prompts handed to the engine at once, in batches: replies are written after each such chunk.
#: Larger chunks keep the continuous batch full longer (it drains at a chunk's end).
CHUNK_BATCHES = 8


@dataclass
class SynthesisOptions:
    max_new_tokens: int = 256
    batch_size: int = 32
    max_prompt_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


def read_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Load and check a conversations jsonl file; a bad line is a one-line error naming it."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"conversations file {str(path)!r}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or "conversation_id" not in record:
            raise ConfigError(f"{where}: expected an object with 'conversation_id' and 'conversations'")
        turns = record.get("conversations")
        if not isinstance(turns, list) or not turns:
            raise ConfigError(f"{where}: 'conversations' must be a non-empty list of {{role, content}}")
        for turn in turns:
            if not isinstance(turn, dict) or turn.get("role") not in _ROLES or not isinstance(turn.get("content"), str):
                raise ConfigError(f"{where}: each turn needs a role (system, user or assistant) and string content")
        if not any(turn["role"] == "user" for turn in turns):
            raise ConfigError(f"{where}: the conversation has no user turn to answer")
        records.append(record)
    return records


def done_ids(path: str | Path) -> set[str]:
    """Conversation ids already written to ``path`` (for resuming)."""
    path = Path(path)
    if not path.exists():
        return set()
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.add(str(json.loads(line)["conversation_id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by an interrupted run is redone
    return ids


def prompt_turns(record: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation up to and including its last user turn."""
    turns = record["conversations"]
    last_user = max(i for i, turn in enumerate(turns) if turn["role"] == "user")
    return [{"role": t["role"], "content": t["content"]} for t in turns[: last_user + 1]]


def synthesize(model: Any, tokenizer: Any, records: list[dict[str, Any]], output: str | Path,
               options: SynthesisOptions, on_batch: Callable[[int, int], None] | None = None) -> int:
    """Append the target's replies to ``records`` to ``output``; returns how many were written.

    ``options.batch_size`` requests decode together; ``on_batch(conversations, new_tokens)`` is
    called after each chunk written (progress display). Prompts longer than
    ``options.max_prompt_tokens`` are skipped: they cost most and teach a short-context drafter least.
    """
    if options.batch_size < 1 or options.max_new_tokens < 1:
        raise ConfigError("batch_size and max_new_tokens must be at least 1")
    skip = done_ids(output)
    todo = []
    for record in records:
        if str(record["conversation_id"]) in skip:
            continue
        ids = tokenizer.apply_chat_template(prompt_turns(record), add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if len(ids) <= options.max_prompt_tokens:
            todo.append((record, list(ids)))
    written = 0
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    chunk = options.batch_size * CHUNK_BATCHES
    with LLM(model, None, tokenizer=tokenizer, max_batch_size=options.batch_size) as llm, \
            output.open("a", encoding="utf-8") as sink:
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            params = [SamplingParams(max_tokens=options.max_new_tokens, temperature=options.temperature,
                                     top_p=options.top_p, seed=options.seed + start + i) for i in range(len(batch))]
            replies = llm.generate([{"prompt_token_ids": ids} for _, ids in batch], params)
            for (record, _), reply in zip(batch, replies):
                turns = prompt_turns(record) + [{"role": "assistant", "content": reply.text}]
                sink.write(json.dumps({**record, "conversations": turns}, ensure_ascii=False) + "\n")
            sink.flush()
            written += len(batch)
            if on_batch is not None:
                on_batch(len(batch), sum(len(r.token_ids) for r in replies))
    return written
