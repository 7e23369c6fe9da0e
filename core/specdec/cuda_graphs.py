"""Recording CUDA graphs, for the target's captured forwards and drafters' recorded steps."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def record_graph(run: Callable[[], T], device: torch.device, pool: object = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Record ``run`` as a CUDA graph (after two warm-up runs on a side stream, as capture
    requires); returns the graph and what the recorded run returned, whose tensors each replay
    rewrites. ``pool``: a memory pool shared with earlier graphs (``graph.pool()``)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No garbage collection while recording (torch collects just before): a collection could
    # free an earlier engine's graphs, whose release is not allowed during a capture. The
    # capture would fail, and leave the CUDA random generator expecting one, so that every
    # later sampling in the process fails.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            outputs = run()
    finally:
        if collecting:
            gc.enable()
    return graph, outputs
