"""A model with another model's config and tokenizer and random weights, for benchmarks where the
real weights cannot go (a GPU machine without the default model's GGUF reader or a model hub).

    python scripts/random_model.py SOURCE OUTPUT              # config, tokenizer, random weights
    python scripts/random_model.py SOURCE OUTPUT --no-weights # config and tokenizer only (a few MB)

SOURCE is a model directory; only its config, generation config and tokenizer are read, so a
directory written with ``--no-weights`` serves as a SOURCE too. Without SOURCE (``-``) it is the
cached default model (SmolLM2-135M-Instruct, converted by ``bash scripts/setup.sh``). Random
weights give real shapes and real timings per forward, not real acceptance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig


def default_source() -> Path:
    """The cached default model; an error naming the command that converts it when it is missing."""
    from specdec.models import DEFAULT_MODEL, cache_dir

    path = cache_dir() / "models" / DEFAULT_MODEL
    if not (path / "config.json").exists():
        raise SystemExit(f"no cached default model at {path}: run `bash scripts/setup.sh` first, or give SOURCE")
    return path


def write_model(source: Path, output: Path, weights: bool, seed: int) -> None:
    """``output`` gets ``source``'s config, generation config and tokenizer, and random weights
    (bfloat16, seeded) unless ``weights`` is false."""
    config = AutoConfig.from_pretrained(source)
    output.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(output)
    if (source / "generation_config.json").exists():
        GenerationConfig.from_pretrained(source).save_pretrained(output)
    if weights:
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(output)
    else:
        config.save_pretrained(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="model directory to copy the config and tokenizer of; '-': the cached default model")
    parser.add_argument("output", type=Path, help="directory to write")
    parser.add_argument("--no-weights", dest="weights", action="store_false", help="write the config and tokenizer only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    source = default_source() if args.source == "-" else Path(args.source)
    write_model(source, args.output, args.weights, args.seed)
    print(f"wrote {args.output} ({'random weights' if args.weights else 'config and tokenizer only'}, from {source})")


if __name__ == "__main__":
    main()
