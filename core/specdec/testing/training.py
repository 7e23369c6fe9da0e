"""Helpers for testing drafter trainers: a tiny target on disk, conversations it answered itself,
and a training run cut short right after a save point (as a killed run stops)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdec.testing.tiny import TinyTarget, make_tiny_target
from specdec.training import loop
from specdec.training.synthesize import SynthesisOptions, read_conversations, synthesize

WORDS = "the cat sat on a mat dog ran far away big red sun sky blue hello world one two three".split()


def saved_target(directory: Path) -> TinyTarget:
    """A tiny Llama (grouped-query attention; it answers at length) saved to ``directory`` with its tokenizer."""
    target = make_tiny_target(seed=0)
    target.model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    return target


def answered(target: TinyTarget, directory: Path, count: int = 16, max_new_tokens: int = 24) -> Path:
    """The target's greedy answers (through `specdec synthesize`'s code) to ``count`` prompts of
    random words, as a conversations jsonl in ``directory``."""
    rng = random.Random(0)
    prompts = directory / "prompts.jsonl"
    with prompts.open("w") as sink:
        for n in range(count):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            sink.write(json.dumps({"conversation_id": f"c{n}", "conversations": [{"role": "user", "content": text}]}) + "\n")
    output = directory / "conversations.jsonl"
    synthesize(target.model, target.tokenizer, read_conversations(prompts), output,
               SynthesisOptions(max_new_tokens=max_new_tokens, batch_size=16))
    return output


class Interrupted(Exception):
    """Raised by :func:`interrupted_after_save`."""


@contextmanager
def interrupted_after_save(step: int) -> Iterator[None]:
    """Inside, a training run raises :class:`Interrupted` right after saving its state at ``step``."""
    save_state = loop.save_state

    def save_then_stop(*args, **kwargs) -> None:
        save_state(*args, **kwargs)
        if args[4].step == step:  # the position saved
            raise Interrupted

    loop.save_state = save_then_stop
    try:
        yield
    finally:
        loop.save_state = save_state
