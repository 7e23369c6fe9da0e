"""Data synthesis: the target answers training prompts itself, so a drafter learns *its* outputs.

Input and output are conversations jsonl in the format of TensorRT Model Optimizer's speculative
training recipes: one object per line with ``conversation_id`` and ``conversations`` (a list of
``{"role", "content"}``). As ModelOpt's chat-mode generation does, the target answers every user
turn in order, each reply following its own earlier replies: the input's assistant turns (written
by some other model, or by people) are dropped, so every assistant token in the output is the
target's. An optional system prompt replaces the input's system turn. A conversation ends early
at a reply cut off by ``max_new_tokens`` (kept, but no user turn follows it) or at a turn whose
prompt is longer than ``max_prompt_tokens``. The output line carries the conversation so
answered plus the input's other fields.

Generation runs on specdec's own engine with continuous batching (a finished reply leaves the
batch and the next prompt joins, so no row waits for the longest reply in its batch) and is greedy
unless a temperature is given; a sampled reply's seed comes from the run's seed, the
conversation's id and the turn, so a resumed run draws what an uninterrupted one would. The
output is appended to and flushed after every chunk of conversations; conversations whose id is
already in it are skipped, so an interrupted run resumes where it stopped.

The target can also write the user turns itself, as in Magpie (Xu et al., 2024, "Alignment Data
Synthesis from Scratch by Prompting Aligned LLMs with Nothing"): given the chat template up to a
user turn's header, an instruction-tuned model samples a request like those it was tuned on.
:func:`self_prompt_records` makes conversations with no user turn, whose opening request the
target writes; ``SynthesisOptions.follow_ups`` lets the target add follow-up requests after the
input's turns are answered. This widens the data beyond a fixed prompt set towards the chat,
writing and code requests the target was tuned on, with no evaluation prompt involved. A
self-written request cut off by ``user_max_tokens`` or left empty ends its conversation.

A small target writes requests of a few kinds over and over (advice, plans, recipes). Openers steer
it: a self-written request may be made to start with the first words of one of a list of openers
("Write a poem", "Imagine you are", "Extract"), picked by the turn's seed, and the target writes
the rest. The words are part of the request, so the reply answers the whole of it. Conditioning
the query on a given prefix is the cheap form of Magpie's domain control; with a model this small,
a domain described in a system turn made its requests incoherent instead.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

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
    #: Replaces the input's system turn (``None``: keep the input's, if any).
    system_prompt: str | None = None
    #: User turns the target writes after the input's are answered (Magpie-style follow-ups).
    follow_ups: int = 0
    #: Sampling of the user turns the target writes (always sampled: greedy would repeat one request).
    user_temperature: float = 1.0
    user_top_p: float = 0.95
    user_max_tokens: int = 128
    #: First words of the opening requests the target writes, one picked per request (empty: none).
    openers: tuple[str, ...] = ()
    #: First words of the follow-up requests the target writes.
    follow_up_openers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Checked here, so a command fails on a bad option before it loads the model.
        if self.batch_size < 1 or self.max_new_tokens < 1 or self.user_max_tokens < 1:
            raise ConfigError("batch_size, max_new_tokens and user_max_tokens must be at least 1")
        if self.follow_ups < 0:
            raise ConfigError("follow_ups must be at least 0")
        if self.user_temperature <= 0 or not 0 < self.user_top_p <= 1:
            raise ConfigError("user_temperature must be > 0 and user_top_p in (0, 1]: the user turns the target "
                              "writes are sampled")


_DECOMPRESSORS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}
UNREADABLE = (lzma.LZMAError, EOFError, UnicodeDecodeError)
"""What reading a damaged compressed file, or a non-UTF-8 one, raises besides :class:`OSError`."""


def open_text(path: str | Path) -> TextIO:
    """``path`` opened as UTF-8 text, decompressed by suffix (``.xz``, ``.gz``, ``.bz2``, as data
    sets kept in a repository are) or plain."""
    return _DECOMPRESSORS.get(Path(path).suffix, open)(path, "rt", encoding="utf-8")


def read_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Load and check a conversations jsonl file, plain or compressed (see :func:`open_text`);
    a bad line is a one-line error naming it."""
    records = []
    try:
        with open_text(path) as source:
            lines = source.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"conversations file {str(path)!r}: {exc.strerror or exc}") from None
    except UNREADABLE as exc:
        raise ConfigError(f"conversations file {str(path)!r}: cannot be read ({exc})") from None
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


def turn_seed(run_seed: int, conversation_id: Any, turn: str) -> int:
    """The sampling seed of one turn: from the run's seed, the conversation and the turn alone, so
    a resumed run, or one in other batches, draws the same turn. ``turn`` is the reply's index
    (``"0"``, ``"1"``...) or ``"user<index>"`` for a user turn the target writes."""
    return random.Random(f"{run_seed}/{conversation_id}/{turn}").getrandbits(31)


def self_prompt_records(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` conversations without a user turn: the target writes their opening requests."""
    return [{"conversation_id": f"self-{seed}-{index}", "conversations": [], "source": "self-prompt"}
            for index in range(count)]


def user_turn_prefix(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` followed by an opened user turn whose content is yet to come.

    Rendered through the chat template with a marker as the user's content and cut at the marker,
    so it works for any template that writes the content verbatim.
    """
    marker = "\u2063specdec-user-turn\u2063"
    text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": marker}], tokenize=False)
    if marker not in text:
        raise ConfigError("the tokenizer's chat template does not write a user turn's content verbatim, "
                          "so the target cannot write user turns with it")
    return list(tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"])


def read_openers(path: str | Path, option: str) -> tuple[str, ...]:
    """The openers in a text file, one per line (blank lines and ``#`` comments skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{option} {str(path)!r}: {exc.strerror or exc}") from None
    openers = tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not openers:
        raise ConfigError(f"{option} {str(path)!r}: no opener in it (one per line)")
    return openers


def pick_opener(openers: tuple[str, ...], run_seed: int, conversation_id: Any, turn: str) -> str:
    """The opener of one self-written user turn, from the turn alone (as :func:`turn_seed`); ``""`` with none."""
    if not openers:
        return ""
    return random.Random(f"{run_seed}/{conversation_id}/{turn}/opener").choice(openers)


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


class _Conversation:
    """One input conversation being answered turn by turn."""

    def __init__(self, record: dict[str, Any], system_prompt: str | None, follow_ups: int) -> None:
        self.record = record
        turns = record["conversations"]
        system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else [
            {"role": "system", "content": t["content"]} for t in turns[:1] if t["role"] == "system"]
        self.messages: list[dict[str, str]] = system
        self.questions = [t["content"] for t in turns if t["role"] == "user"]
        # With no user turn in the input the target writes the opening request too.
        self.to_write = follow_ups + (0 if self.questions else 1)
        self.answered = 0
        self.ended = False

    def wants_user_turn(self) -> bool:
        """Whether the target is to write this conversation's next user turn."""
        return not self.ended and self.answered == len(self.questions) and self.to_write > 0

    def ask(self, text: str | None) -> None:
        """Add the user turn the target wrote; ``None`` (cut off or empty) ends the conversation."""
        self.to_write -= 1
        if text is None:
            self.ended = True
        else:
            self.questions.append(text)

    def next_prompt(self) -> list[dict[str, str]] | None:
        """The conversation up to its next user turn, or ``None`` when it is done."""
        if self.ended or self.answered == len(self.questions):
            return None
        return [*self.messages, {"role": "user", "content": self.questions[self.answered]}]

    def answer(self, text: str, cut: bool) -> None:
        self.messages += [{"role": "user", "content": self.questions[self.answered]}, {"role": "assistant", "content": text}]
        self.answered += 1
        self.ended = cut


def _write_user_turns(llm: LLM, tokenizer: Any, conversations: list[_Conversation], options: SynthesisOptions) -> int:
    """The target writes the next user turn of each of ``conversations``; returns the tokens generated."""
    asked = []
    for conversation in conversations:
        conversation_id, turn = conversation.record["conversation_id"], f"user{len(conversation.questions)}"
        openers = options.follow_up_openers if conversation.questions else options.openers
        opener = pick_opener(openers, options.seed, conversation_id, turn)
        ids = user_turn_prefix(tokenizer, conversation.messages)
        ids += tokenizer(opener, add_special_tokens=False)["input_ids"] if opener else []
        if len(ids) > options.max_prompt_tokens:
            conversation.ask(None)
            continue
        params = SamplingParams(max_tokens=options.user_max_tokens, temperature=options.user_temperature,
                                top_p=options.user_top_p, seed=turn_seed(options.seed, conversation_id, turn))
        asked.append((conversation, opener, {"prompt_token_ids": ids}, params))
    if not asked:
        return 0
    replies = llm.generate([prompt for _, _, prompt, _ in asked], [params for _, _, _, params in asked])
    for (conversation, opener, _, _), reply in zip(asked, replies):
        text = reply.text.strip()
        conversation.ask((opener + reply.text).strip() if text and reply.finish_reason != "length" else None)
    return sum(len(reply.token_ids) for reply in replies)


def synthesize(model: Any, tokenizer: Any, records: list[dict[str, Any]], output: str | Path,
               options: SynthesisOptions, on_batch: Callable[[int, int], None] | None = None,
               llm_options: dict[str, Any] | None = None) -> int:
    """Append the target's answers to ``records`` to ``output``; returns how many conversations
    were written. ``llm_options`` go to :class:`~specdec.LLM` (``execution``, ``max_model_len``).

    ``options.batch_size`` requests decode together; ``on_batch(conversations, new_tokens)`` is
    called after each chunk written (progress display). A conversation whose first prompt is
    longer than ``options.max_prompt_tokens`` is skipped: long prompts cost most and teach a
    short-context drafter least.
    """
    skip = done_ids(output)
    todo = [record for record in records if str(record["conversation_id"]) not in skip]
    written = 0
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    chunk = options.batch_size * CHUNK_BATCHES
    with LLM(model, None, tokenizer=tokenizer, max_batch_size=options.batch_size, **(llm_options or {})) as llm, \
            output.open("a", encoding="utf-8") as sink:
        for start in range(0, len(todo), chunk):
            conversations = [_Conversation(record, options.system_prompt, options.follow_ups)
                             for record in todo[start : start + chunk]]
            tokens = 0
            # One round per turn: the target writes the user turns due, then every conversation
            # still going answers its next user turn.
            while True:
                tokens += _write_user_turns(llm, tokenizer, [c for c in conversations if c.wants_user_turn()], options)
                asked = []
                for conversation in conversations:
                    messages = conversation.next_prompt()
                    if messages is None:
                        continue
                    ids = llm.encode(messages, chat=True)
                    if len(ids) > options.max_prompt_tokens:
                        conversation.ended = True
                        continue
                    seed = turn_seed(options.seed, conversation.record["conversation_id"], str(conversation.answered))
                    params = SamplingParams(max_tokens=options.max_new_tokens, temperature=options.temperature,
                                            top_p=options.top_p, seed=seed)
                    asked.append((conversation, {"prompt_token_ids": ids}, params))
                if not asked:
                    break
                replies = llm.generate([prompt for _, prompt, _ in asked], [params for _, _, params in asked])
                for (conversation, _, _), reply in zip(asked, replies):
                    conversation.answer(reply.text, reply.finish_reason == "length")
                    tokens += len(reply.token_ids)
            done = [c for c in conversations if c.answered]
            for conversation in done:
                sink.write(json.dumps({**conversation.record, "conversations": conversation.messages}, ensure_ascii=False) + "\n")
            sink.flush()
            written += len(done)
            if on_batch is not None:
                on_batch(len(conversations), tokens)
    return written
