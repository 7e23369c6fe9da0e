"""A tiny target on disk and training conversations it answered itself (through `specdec synthesize`'s code)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from specdec.testing import TinyTarget, make_tiny_target
from specdec.training.synthesize import SynthesisOptions, synthesize

WORDS = "the cat sat on a mat dog ran far away big red sun sky blue hello world one two three".split()


def tiny_target(num_layers: int = 3) -> TinyTarget:
    return make_tiny_target(seed=0, num_layers=num_layers)


def save_target(target: TinyTarget, directory: Path) -> Path:
    target.model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    return directory


def prompts_file(path: Path, count: int, seed: int = 0) -> Path:
    """``count`` user prompts of random words (conversations jsonl without replies)."""
    rng = random.Random(seed)
    with path.open("w") as sink:
        for n in range(count):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
            sink.write(json.dumps({"conversation_id": f"c{n}", "conversations": [{"role": "user", "content": text}]}) + "\n")
    return path


def synthesized(target: TinyTarget, directory: Path, count: int = 48, max_new_tokens: int = 48,
                temperature: float = 0.8) -> Path:
    """The tiny target's own answers to ``count`` prompts (sampled: more varied text than its greedy loops)."""
    prompts = prompts_file(directory / "prompts.jsonl", count)
    output = directory / "conversations.jsonl"
    from specdec.training.synthesize import read_conversations

    synthesize(target.model, target.tokenizer, read_conversations(prompts), output,
               SynthesisOptions(max_new_tokens=max_new_tokens, batch_size=16, temperature=temperature))
    return output
