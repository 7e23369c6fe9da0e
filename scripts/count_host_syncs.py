"""Count the host syncs of a decoding step on CUDA (the GPU check's `syncs` step).

Every `.item()`, `.tolist()`, `int(tensor)` or data-dependent shape on a CUDA tensor makes the host
wait for the GPU. PyTorch's sync debug mode warns at each one; this script decodes a few prompts
per method with it on and prints the syncs per decoding step and where they come from (file and
line, most frequent first).

Usage: python scripts/count_host_syncs.py MODEL [--methods none,ngram,eagle3,mtp,medusa] [--max-tokens 32]
(a method whose shipped weights are not in the tree is left out).
Without CUDA it says so and exits 0 (a dry run of the GPU check on a CPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import traceback
import warnings
from pathlib import Path

import torch

from specdec import LLM, SamplingParams

#: The drafters shipped for SmolLM2-135M (MODEL must have its shape).
WEIGHTS = "plugins/{method}/specdec_{method}/weights/smollm2-{method}"
CONFIGS = {
    "none": None,
    "ngram": {"decoding_type": "NGram", "max_draft_len": 4},
    "eagle3": {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model": WEIGHTS.format(method="eagle3")},
    "mtp": {"decoding_type": "MTP", "max_draft_len": 3, "speculative_model": WEIGHTS.format(method="mtp")},
    "medusa": {"method": "medusa", "speculative_model": WEIGHTS.format(method="medusa")},
}
PROMPTS = ["Summarize: the quick brown fox jumps over the lazy dog. The dog sleeps.", "Write a haiku about GPUs."]


def count(llm: LLM, params: SamplingParams) -> dict:
    """Syncs over generating every prompt once (after a warm-up), per decoding step, by place."""
    llm.generate(PROMPTS[0], params.model_copy(update={"max_tokens": 4}), chat=True)
    places: collections.Counter[str] = collections.Counter()
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message).lower():
            frames = [f for f in traceback.extract_stack()[:-1] if "specdec" in f.filename and "count_host_syncs" not in f.filename]
            where = frames[-1] if frames else None
            places[f"{where.filename.split('specdec/')[-1]}:{where.lineno}" if where else "?"] += 1

    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            outputs = llm.generate(PROMPTS, params, chat=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = original
    steps = sum(o.metrics.num_steps for o in outputs)
    total = sum(places.values())
    return {"syncs": total, "steps": steps, "syncs_per_step": total / steps if steps else None,
            "places": places.most_common(15)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--methods", default="none,ngram,eagle3,mtp,medusa")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("count_host_syncs: no CUDA device; nothing to count")
        return
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    results = {}
    for method in args.methods.split(","):
        weights = (CONFIGS[method] or {}).get("speculative_model")
        if weights is not None and not Path(weights).is_dir():
            print(method, "skipped: no", weights)
            continue
        with LLM(args.model, CONFIGS[method], dtype="bfloat16") as llm:
            results[method] = {"execution": llm.runner.execution, **count(llm, params)}
        print(method, json.dumps(results[method], indent=1))


if __name__ == "__main__":
    main()
