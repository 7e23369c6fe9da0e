"""What a drafting step costs, eager and in fixed shapes (the GPU check's `drafting` step).

For each drafter shipped for SmolLM2-135M (MODEL must have its shape; see count_host_syncs.py),
decode a few chat prompts greedily at a fixed draft length (the adaptive policy and suffix drafts
off, so both runs draft the same lengths): once with everything eager (`execution="eager"`), once
with the default execution, where on CUDA the target's forwards are captured and the drafting
steps recorded as CUDA graphs (`static` on a CPU, a dry run). Prints the drafting time and the
target forward's time per step (the engine's own timings, after a warm-up that records every
shape the runs meet) and how many outputs the two runs share.

Usage: python scripts/profile_drafting.py MODEL [--methods eagle3,mtp,medusa] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from count_host_syncs import CONFIGS

from specdec import LLM, SamplingParams

PROMPTS = ["Explain how a hash map works, briefly.", "Write a short poem about the sea.", "List three uses of copper."]


def timed(model: str, config: dict, execution: str, dtype: str, max_tokens: int) -> tuple[float, float, list[list[int]]]:
    """Drafting and target-forward milliseconds per step over the prompts, and the outputs."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    with LLM(model, {**config, "adaptive_draft_len": False, "use_sa_spec": False}, execution=execution, dtype=dtype) as llm:
        llm.generate(PROMPTS, params, chat=True)  # warm-up: every shape the runs meet is recorded here
        outputs = [llm.generate(prompt, params, chat=True)[0] for prompt in PROMPTS]
    steps = sum(o.metrics.num_steps for o in outputs)
    draft = sum(o.metrics.time_draft for o in outputs) / steps * 1e3
    forward = sum(o.metrics.time_forward for o in outputs) / steps * 1e3
    return draft, forward, [o.token_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--methods", default="eagle3,mtp,medusa")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dtype, fixed = ("bfloat16", "cuda_graph") if cuda else ("float32", "static")
    for method in args.methods.split(","):
        config = CONFIGS[method]
        if not Path(config["speculative_model"]).is_dir():
            print(f"{method}: skipped, no {config['speculative_model']}")
            continue
        eager = timed(args.model, config, "eager", dtype, args.max_tokens)
        recorded = timed(args.model, config, fixed, dtype, args.max_tokens)
        same = sum(a == b for a, b in zip(eager[2], recorded[2]))
        print(f"{method}: drafting {eager[0]:.2f} ms a step eager, {recorded[0]:.2f} {fixed} ({eager[0] / recorded[0]:.1f}x); "
              f"target forward {eager[1]:.2f} / {recorded[1]:.2f} ms; outputs equal {same} of {len(PROMPTS)}")


if __name__ == "__main__":
    main()
