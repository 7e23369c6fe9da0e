"""The static-shape forward: a batch's verify forward with fixed shapes, captured once, replayed.

One eager forward of a small model is mostly the host launching kernels (on an H100, ~30 per
SmolLM2 layer, 23.7 ms a forward while the GPU needs under 0.1 ms to stream the weights). vLLM,
SGLang and TensorRT-LLM record each decode/verify shape once as a CUDA graph and replay it; this
module does the same for the runner's batched forward over a :class:`~specdec.static_cache.StaticKVCache`.

Every input of the forward lives in fixed tensors (token ids, positions, each row's cache length
and which of its new tokens each token sees); the attention mask, the cache write positions and
the model forward are all computed from them inside the recorded region, so a replay needs one
host-to-device copy. Shapes are bucketed: the batch is padded up to the next of
:func:`batch_buckets` (padding rows write to unused cache rows) and the tokens per row up to the
next of :func:`width_buckets` (padding tokens write past the row's length, where stale entries
already lie), and the keys attended over to the next of :func:`key_length_buckets` that holds
the longest row; a shape past the largest bucket runs the same static forward without a graph.

Execution modes (``--enforce-eager`` and ``--compile`` on the command line):

- ``cuda_graph`` (the default on CUDA): each bucket captured with ``torch.cuda.CUDAGraph`` at
  start-up, all sharing one memory pool. Chosen over ``torch.compile(mode="reduce-overhead")``
  because it records transformers' modules as they are, with no tracing, recompiles or minutes
  of compilation per shape, and a captured forward launches the same kernels the eager one does,
  so its logits equal the eager path's.
- ``compile``: the static forward through ``torch.compile`` (inductor), one graph per bucket;
  on any device, opt-in (measured slower than the eager runner on CPU: docs/performance.md). On
  CUDA each compiled bucket is then captured as a CUDA graph too: inductor fuses the forward's
  small kernels, and a graph replays the fused ones without launching each from the host.
- ``static``: the bucketed static forward run eagerly, with no capture (tests the padding and
  bucketing on machines without a GPU).
- ``eager`` (the default on CPU): the runner's ordinary forward over a growing cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from specdec.cuda_graphs import record_graph
from specdec.progress import Progress, log_console
from specdec.static_cache import StaticKVCache

log = logging.getLogger("specdec.static_forward")

#: The execution modes, ``auto`` resolving to ``cuda_graph`` on CUDA and ``eager`` elsewhere.
EXECUTION_MODES = ("auto", "eager", "cuda_graph", "compile", "static")

#: Every token count up to this one is a width bucket of its own; past it, powers of two.
_DENSE_WIDTHS = 16

Visibility = Callable[[list[int] | None, int], tuple[torch.Tensor, list[int]]]


def resolve_execution(mode: str, device: torch.device) -> str:
    """The mode ``mode`` means on ``device`` (``auto``: CUDA graphs on CUDA, else eager)."""
    if mode not in EXECUTION_MODES:
        raise ValueError(f"execution: one of {', '.join(EXECUTION_MODES)}, not {mode!r}")
    if mode == "auto":
        return "cuda_graph" if device.type == "cuda" else "eager"
    if mode == "cuda_graph" and device.type != "cuda":
        raise ValueError(f"execution: CUDA graphs need a CUDA device, not {device.type}")
    return mode


def batch_buckets(max_rows: int) -> list[int]:
    """Batch sizes captured: powers of two below ``max_rows``, and ``max_rows`` itself."""
    sizes = [1]
    while sizes[-1] * 2 < max_rows:
        sizes.append(sizes[-1] * 2)
    return sorted(set(sizes + [max_rows]))


def width_buckets(max_width: int) -> list[int]:
    """Tokens per row captured: every count up to 16 (chains), then powers of two up to
    ``max_width`` (draft trees), ``max_width`` itself last."""
    widths = list(range(1, min(max_width, _DENSE_WIDTHS) + 1))
    while widths[-1] * 2 < max_width:
        widths.append(widths[-1] * 2)
    return sorted(set(widths + [max_width]))


#: The shortest key length recorded; each longer one is ``KEY_LENGTH_STEP`` times the last.
MIN_KEY_LENGTH = 512
KEY_LENGTH_STEP = 4


def key_length_buckets(capacity: int) -> list[int]:
    """Key positions a forward attends over: 512, 2,048, 8,192 ... up to half of ``capacity``,
    then ``capacity`` (a bucket barely shorter than the whole would only add graphs). A request
    300 tokens in attends over 512 positions, not the 8,192 reserved."""
    lengths = []
    length = MIN_KEY_LENGTH
    while 2 * length <= capacity:
        lengths.append(length)
        length *= KEY_LENGTH_STEP
    return lengths + [capacity]


def bucket_for(size: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding ``size``; ``None`` past the largest."""
    return next((b for b in buckets if b >= size), None)


def use_recordable_experts(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Mixture-of-experts layers that run through transformers' ``grouped_mm`` switch to
    ``batched_mm`` before their forwards are recorded, unless in bfloat16. ``grouped_mm`` has
    kernels for bfloat16 alone; in other dtypes it loops over the experts, reading their token
    counts on the host, which a CUDA graph cannot record. ``batched_mm`` gathers each token's
    experts' weights, every shape fixed by the number of tokens."""
    config = getattr(model, "config", None)
    if dtype == torch.bfloat16 or getattr(config, "_experts_implementation", None) != "grouped_mm":
        return
    model.set_experts_implementation("batched_mm")
    log.info("mixture-of-experts layers use batched_mm for recorded %s forwards", dtype)


@dataclass
class _Bucket:
    """The fixed inputs of one shape, packed in one tensor so a step copies them in once, and
    what its capture returned."""

    rows: int
    width: int
    #: Key positions attended over (:func:`key_length_buckets`).
    key_length: int
    #: The hidden states the forward returns (:attr:`ModelRunner.hidden_layers`).
    hidden_layers: tuple[int, ...]
    packed: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    outputs: tuple[torch.Tensor, tuple[torch.Tensor, ...] | None] | None = None
    inputs: tuple[torch.Tensor, ...] = field(init=False)

    def __post_init__(self) -> None:
        b, w = self.rows, self.width
        sizes = [b * w, b * w, b, b * w * w]
        ids, positions, starts, visible = self.packed.split(sizes)
        self.inputs = (ids.view(b, w), positions.view(b, w), starts, visible.view(b, w, w))


class StaticForward:
    """Runs the runner's batched forward over a :class:`StaticKVCache` with bucketed fixed shapes.

    :param forward_model: calls the model over the cache (``input_ids``, ``position_ids``,
        ``attention_mask``, the indices of the hidden states to return) and returns float logits
        ``[rows, width, vocab]`` and those hidden states, in that order (``None`` for none).
    :param layer_masks: turns the additive mask, positions and the key positions into the
        model's ``attention_mask`` argument (one per layer type for sliding-window models).
    """

    def __init__(
        self,
        mode: str,
        cache: StaticKVCache,
        forward_model: Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]],
        visibility: Visibility,
        layer_masks: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | dict[str, torch.Tensor]],
        dtype: torch.dtype,
        device: torch.device,
        max_width: int,
    ) -> None:
        self.mode = mode
        self.cache = cache
        self.device = device
        self.dtype = dtype
        self._forward_model = forward_model
        self._visibility = visibility
        self._layer_masks = layer_masks
        self.batch_sizes = batch_buckets(cache.max_rows)
        self.widths = width_buckets(max_width)
        self.key_lengths = key_length_buckets(cache.capacity)
        self._buckets: dict[tuple[int, int, int, tuple[int, ...]], _Bucket] = {}
        self._pool = None
        #: Device memory the recorded graphs took beside the KV cache (CUDA; 0 elsewhere).
        self.capture_bytes = 0
        self._run = torch.compile(self._static_forward, dynamic=False) if mode == "compile" else self._static_forward
        if mode == "compile":
            # One graph per bucket; dynamo's default of 8 per function would fall back to eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(self.batch_sizes) * len(self.widths) * len(self.key_lengths))

    @property
    def captures(self) -> bool:
        """Whether shapes inside the buckets are recorded (CUDA graphs, or compiled)."""
        return self.mode in ("cuda_graph", "compile")

    def capture_all(self, hidden_layers: tuple[int, ...], show_progress: bool = True) -> None:
        """Record every bucket now (start-up) rather than at its first use; :attr:`memory` says
        what it took."""
        if not self.captures:
            return
        before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        shapes = [(b, w, k) for b in self.batch_sizes for w in self.widths for k in self.key_lengths]
        columns = (TextColumn("[bold]capturing forward shapes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        # On stderr: stdout carries a command's results (`generate --json` lines).
        with Progress(*columns, console=log_console(stderr=True), disable=not show_progress, transient=True) as progress:
            task = progress.add_task("capture", total=len(shapes))
            for rows, width, key_length in shapes:
                self._prepared(rows, width, key_length, hidden_layers)
                progress.advance(task)
        if self.device.type == "cuda":
            self.capture_bytes = torch.cuda.memory_allocated(self.device) - before - self.cache_bytes()
        log.info("captured %d forward shapes (%s): %.0f MB beside a KV cache of %.0f MB", len(shapes), self.mode,
                 self.capture_bytes / 2**20, self.cache_bytes() / 2**20)

    def cache_bytes(self) -> int:
        """What the static KV cache's buffers hold (allocated at the first forward)."""
        return sum(
            buf.numel() * buf.element_size()
            for layer in self.cache.layers for buf in (layer._key_buf, layer._value_buf) if buf is not None
        )

    @property
    def memory(self) -> dict[str, int]:
        """Bytes of device memory: the KV cache's, and (CUDA) what capture added beside it."""
        return {"kv_cache_bytes": self.cache_bytes(), "capture_bytes": self.capture_bytes}

    def run(
        self, rows: list[list[int]], parents: list[list[int] | None] | None, hidden_layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Write ``rows[b]`` at the cache's ``lengths[b]`` onward; logits ``[len(rows), width, vocab]``
        and the hidden states ``hidden_layers`` (padded to the widest row), owned by the caller."""
        n, width = len(rows), max(len(r) for r in rows)
        self.cache.check_room(n, width)
        bucket_rows, bucket_width = bucket_for(n, self.batch_sizes), bucket_for(width, self.widths)
        # Every key this forward reads or writes lies below its longest row's end (padding rows
        # write from position 0); check_room has made sure the whole cache holds it.
        key_length = bucket_for(max(self.cache.lengths[:n], default=0) + width, self.key_lengths)
        if bucket_rows is None or bucket_width is None:
            inputs = self._host_inputs(rows, parents, n, width).to(self.device)
            return self._static_forward(*_Bucket(n, width, key_length, hidden_layers, inputs).inputs, hidden_layers, key_length)
        bucket = self._prepared(bucket_rows, bucket_width, key_length, hidden_layers)
        bucket.packed.copy_(self._host_inputs(rows, parents, bucket_rows, bucket_width), non_blocking=True)
        if bucket.graph is not None:
            bucket.graph.replay()
            logits, hidden = bucket.outputs
        else:
            logits, hidden = self._run(*bucket.inputs, hidden_layers, key_length)
        # A replay overwrites its outputs: hand out copies of the rows that are real.
        logits = logits[:n, :width].clone()
        hidden = tuple(h[:n, :width].clone() for h in hidden) if hidden is not None else None
        return logits, hidden

    def _prepared(self, rows: int, width: int, key_length: int, hidden_layers: tuple[int, ...]) -> _Bucket:
        bucket = self._buckets.get((rows, width, key_length, hidden_layers))
        if bucket is None:
            packed = self._host_inputs([], None, rows, width).to(self.device)
            bucket = self._buckets[(rows, width, key_length, hidden_layers)] = _Bucket(rows, width, key_length, hidden_layers, packed)
            if self.mode == "compile":
                # An eager run first allocates the cache's buffers: compiled before, the
                # graph would guard on their absence and recompile once they exist.
                self._static_forward(*bucket.inputs, hidden_layers, key_length)
                self._run(*bucket.inputs, hidden_layers, key_length)  # compiles this shape
            if self.mode == "cuda_graph" or (self.mode == "compile" and self.device.type == "cuda"):
                self._capture(bucket)
        return bucket

    def _capture(self, bucket: _Bucket) -> None:
        """Record ``bucket``'s forward as a CUDA graph. The warm-up runs write to the cache where
        the bucket's inputs say: at the positions of the step being run, with the same values, or
        into rows nobody holds yet."""
        bucket.graph, bucket.outputs = record_graph(
            lambda: self._run(*bucket.inputs, bucket.hidden_layers, bucket.key_length), self.device, self._pool
        )
        self._pool = bucket.graph.pool()

    def _host_inputs(self, rows: list[list[int]], parents: list[list[int] | None] | None, num_rows: int, width: int) -> torch.Tensor:
        """The packed inputs of a forward padded to ``num_rows`` x ``width``, on the host."""
        ids = torch.zeros(num_rows, width, dtype=torch.long)
        positions = torch.zeros(num_rows, width, dtype=torch.long)
        starts = torch.zeros(num_rows, dtype=torch.long)
        visible = torch.zeros(num_rows, width, width, dtype=torch.long)
        lengths = self.cache.lengths
        for b in range(num_rows):
            if b < len(rows):
                ids[b, : len(rows[b])] = torch.tensor(rows[b])
                start = lengths[b]
                row_visible, depths = self._visibility(parents[b] if parents is not None else None, width)
            else:  # a padding row: its tokens see only themselves, at the start of an unused row
                start, row_visible, depths = 0, torch.eye(width, dtype=torch.bool), list(range(width))
            starts[b] = start
            positions[b] = torch.tensor(depths) + start
            visible[b] = row_visible
        return torch.cat([ids.flatten(), positions.flatten(), starts, visible.flatten()])

    def _static_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor, visible: torch.Tensor,
        hidden_layers: tuple[int, ...], key_length: int,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The forward from fixed inputs alone (what a graph records): the mask over the first
        ``key_length`` positions of the cache, the write positions, the model."""
        rows, width = input_ids.shape
        self.cache.attend = key_length
        self.cache.write_positions = starts[:, None] + torch.arange(width, device=input_ids.device)
        keys = torch.arange(key_length, device=input_ids.device)
        offset = keys[None, :] - starts[:, None]  # [rows, key_length]: key index within this forward's tokens
        in_forward = (offset >= 0) & (offset < width)
        sees_new = visible.bool().gather(2, offset.clamp(0, width - 1)[:, None, :].expand(rows, width, key_length))
        allowed = (offset < 0)[:, None, :] | (in_forward[:, None, :] & sees_new)
        mask = torch.zeros((rows, 1, width, key_length), dtype=self.dtype, device=input_ids.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
        key_positions = keys.expand(rows, key_length).scatter(1, self.cache.write_positions, positions)
        return self._forward_model(input_ids, positions, self._layer_masks(mask, positions, key_positions), hidden_layers)
