"""``specdec bench-kernels``: time the verify operations, Triton kernels against the torch path.

Inputs are random but realistic (peaked target rows, drafts that are often accepted) and the
same for both backends; each result is checked equal between backends before it is timed. On a
machine without a usable GPU only the torch path runs, and the table says why.
"""

from __future__ import annotations

from typing import Any

import click
import torch
from rich.table import Table

from specdec import kernels
from specdec.bench.timing import median_seconds
from specdec.errors import ConfigError
from specdec.kernels import reference
from specdec.progress import log_console


def _inputs(op: str, batch: int, k: int, vocab: int, device: torch.device, dtype: torch.dtype) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    args: tuple[Any, ...]
    if op == "tree":
        parents = torch.tensor([[-1 if i < 2 else (i - 2) // 2 for i in range(k)]] * batch)  # a binary tree
        args = (torch.randint(0, 2, (batch, k), generator=g), parents, torch.full((batch,), k),
                torch.randint(0, 2, (batch, k + 1), generator=g))
        return tuple(a.to(device) for a in args)
    target_probs = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) * 4, -1)
    draft_ids = target_probs[:, :k].argmax(-1)  # drafts the target likes: long accepted runs
    num_drafts = torch.full((batch,), k)
    if op == "greedy":
        args = (draft_ids, num_drafts, target_probs.argmax(-1))
    else:
        draft_probs = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 4, -1).to(dtype) if op == "rejection" else None
        exponential = torch.rand(batch, vocab, generator=g).neg_().log1p_().neg_()
        args = (draft_ids, num_drafts, draft_probs, target_probs.to(dtype), torch.rand(batch, k, generator=g), exponential)
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


OPS = {
    "greedy": ("greedy_accept", "greedy acceptance"),
    "rejection": ("rejection_accept", "rejection sampling, draft probs"),
    "rejection-onehot": ("rejection_accept", "rejection sampling, one-hot drafts"),
    "tree": ("tree_accept", "tree acceptance (binary tree)"),
}


@click.command("bench-kernels")
@click.option("--batch", "batches", default="1,8,32", show_default=True, help="Comma list of batch sizes.")
@click.option("--draft-len", type=click.IntRange(min=1), default=4, show_default=True,
              help="Drafts per request (nodes per tree for the tree operation).")
@click.option("--vocab", type=click.IntRange(min=1), default=49152, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True,
              help="Probability dtype for rejection sampling.")
@click.option("--ops", default=",".join(OPS), show_default=True, help="Comma list of operations to time.")
@click.option("--iters", type=click.IntRange(min=1), default=50, show_default=True, help="Timed calls per measurement.")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
def bench_kernels(batches: str, draft_len: int, vocab: int, dtype: str, ops: str, iters: int, device: str | None) -> None:
    """Time the verify operations: Triton kernels vs the torch path (GPU machines; CPU runs torch only)."""
    try:
        sizes = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--batch: expected a comma list of integers, got {batches!r}") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--batch: batch sizes must be at least 1, got {batches!r}")
    chosen = [o.strip() for o in ops.split(",") if o.strip()]
    unknown = sorted(set(chosen) - set(OPS))
    if unknown or not chosen:
        raise ConfigError(f"--ops: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(OPS)}")
    try:
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise ConfigError(f"--device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: cuda requested, but no CUDA device is available")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    status = kernels.triton_status()
    kernel_runs = status.usable and (dev.type == "cuda" or status.interpreted)
    module = None
    if kernel_runs:
        from specdec.kernels import triton_kernels as module

    console = log_console()
    table = Table(title=f"verify operations on {dev}: median µs per call (draft length {draft_len}, vocab {vocab}, {dtype})")
    for col in ("operation", "batch", "torch µs", "triton µs", "speedup", "same result"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for op in chosen:
        name, label = OPS[op]
        for batch in sizes:
            args = _inputs(op, batch, draft_len, vocab, dev, getattr(torch, dtype))
            torch_fn = getattr(reference, name)
            torch_s = median_seconds(lambda: torch_fn(*args), iters, sync)
            if module is None:
                table.add_row(label, str(batch), f"{torch_s * 1e6:.1f}", "-", "-", "-")
                continue
            kernel_fn = getattr(module, name)
            same = all(torch.equal(a, b) for a, b in zip(kernel_fn(*args), torch_fn(*args)))
            kernel_s = median_seconds(lambda: kernel_fn(*args), iters, sync)
            table.add_row(label, str(batch), f"{torch_s * 1e6:.1f}", f"{kernel_s * 1e6:.1f}", f"{torch_s / kernel_s:.2f}x",
                          "yes" if same else "[red]NO[/]")
    console.print(table)
    if module is None:
        why = status.reason if not status.usable else f"the kernels need CUDA tensors, and --device is {dev.type}"
        console.print(f"triton kernels not timed: {why}")
