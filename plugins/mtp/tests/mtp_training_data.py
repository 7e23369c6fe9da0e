"""A tiny Llama target on disk and conversations it answered itself (greedy, through `specdec synthesize`'s code)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from specdec.testing import TinyTarget, make_tiny_target
from specdec.training.synthesize import SynthesisOptions, read_conversations, synthesize

WORDS = "the cat sat on a mat dog ran far away big red sun sky blue hello world one two three".split()


def saved_llama(directory: Path) -> TinyTarget:
    """A tiny Llama (grouped-query attention; it answers at length, where the architecture suite's
    Llama ends its replies at once), saved to ``directory`` with its tokenizer."""
    target = make_tiny_target(seed=0)
    target.model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    return target


def answered(target: TinyTarget, directory: Path, count: int = 16, max_new_tokens: int = 24) -> Path:
    """The target's greedy answers to ``count`` prompts of random words, as a conversations jsonl."""
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
