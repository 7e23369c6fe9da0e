"""Where a captured decoding step's time goes on CUDA (the GPU check's `profile` step).

First the cost of a forward by width on the default execution path, at a few contexts, the
widths taking turns (tells a real step in the cost from noise). Then, for one plain decoding
step at batch 1, it times the whole ``runner.forward_rows`` call, the graph
replay alone, and the host-side input packing alone, for each ``--max-model-len`` (the static path
attends over every reserved position, so this shows what that length costs) and for inductor's
fused kernels captured the same way (``--compile``), next to an eager forward; then the CUDA
kernels of each replay, longest first (torch.profiler).

Usage: python scripts/profile_step.py MODEL (a directory, or `default`) [--max-model-len 1024,8192] [--context 512]
Without CUDA it times the static path uncaptured and the eager forward (a dry run on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specdec import ModelRunner, load_model
from specdec.bench.timing import median_seconds
from specdec.static_forward import bucket_for


def median_ms(fn: Callable[[], object], sync: Callable[[], None], repeats: int = 50) -> float:
    return median_seconds(fn, repeats, sync) * 1e3


def profile(model: torch.nn.Module, execution: str, max_model_len: int, context: int, sync: Callable[[], None]) -> dict:
    runner = ModelRunner(model, execution=execution, max_model_len=max_model_len)
    runner.prepare(max_rows=1, max_width=1)
    cache = runner.new_batch_cache(1) if runner.static else runner.new_cache(1)
    runner.forward_rows(cache, [list(range(100, 100 + context))])

    def step() -> None:
        runner.forward_rows(cache, [[5]])
        runner.rollback_rows(cache, [1])

    result = {"execution": runner.execution, "max_model_len": max_model_len, "step_ms": median_ms(step, sync)}
    static = runner._static
    if static is not None:
        result["pack_inputs_ms"] = median_ms(lambda: static._host_inputs([[5]], None, 1, 1), lambda: None)
        key_length = bucket_for(context + 1, static.key_lengths)
        bucket = static._buckets.get((1, 1, key_length, runner.hidden_layers))
        if bucket is not None and bucket.graph is not None:
            result["replay_ms"] = median_ms(bucket.graph.replay, sync)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                bucket.graph.replay()
                sync()
            result["kernels"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    return result


def width_curve(model: torch.nn.Module, contexts: list[int], widths: list[int], sync: Callable[[], None],
                rounds: int = 30) -> dict[int, list[float]]:
    """By context, the median time of a forward of each width over a one-token forward's, on the
    default execution path. The widths take turns within each round, so a slow moment of the
    machine falls on all of them alike: a width that costs more here than a wider one costs it
    every time (the draft policy's own measurement, a few runs per width, cannot tell)."""
    runner = ModelRunner(model)
    runner.prepare(max_rows=1, max_width=max(widths))
    curves = {}
    for context in contexts:
        cache = runner.new_batch_cache(1)
        runner.forward_rows(cache, [list(range(100, 100 + context))])
        times: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(rounds):
            for width in widths:
                sync()
                start = time.perf_counter()
                runner.forward_rows(cache, [[5] * width])
                sync()
                times[width].append(time.perf_counter() - start)
                runner.rollback_rows(cache, [width])
        one = statistics.median(times[1])
        curves[context] = [statistics.median(times[w]) / one for w in widths]
        print(f"context {context}: one token {one * 1e3:.2f} ms; by width " +
              ", ".join(f"{w}: {r:.2f}" for w, r in zip(widths, curves[context])))
    return curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--max-model-len", default="1024,8192", help="comma list of reserved lengths to compare")
    parser.add_argument("--context", type=int, default=512, help="cached tokens before the timed step")
    parser.add_argument("--curve-contexts", default="128,1024,3000",
                        help="contexts of the width curve (forward cost by width, widths taking turns); empty: none")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    model, _ = load_model(None if args.model == "default" else args.model, "bfloat16" if cuda else "float32", "cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        eager = profile(model, "eager", max(int(n) for n in args.max_model_len.split(",")), args.context, sync)
        print(f"eager forward: {eager['step_ms']:.2f} ms per step")
        if args.curve_contexts:
            width_curve(model, [int(c) for c in args.curve_contexts.split(",")], [*range(1, 10), 12, 16], sync)
        lengths = [int(n) for n in args.max_model_len.split(",")]
        # Captured eager kernels at each reserved length; on CUDA also inductor's fused ones,
        # captured (one compile, at the shortest length).
        runs = [("cuda_graph" if cuda else "static", n) for n in lengths] + ([("compile", min(lengths))] if cuda else [])
        for execution, length in runs:
            result = profile(model, execution, length, args.context, sync)
            parts = ", ".join(f"{k} {result[k]:.2f}" for k in ("step_ms", "replay_ms", "pack_inputs_ms") if k in result)
            print(f"{result['execution']}, max_model_len {length}: {parts}")
            if "kernels" in result:
                print(result["kernels"])


if __name__ == "__main__":
    main()
