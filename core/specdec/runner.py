"""The target model runner: a Hugging Face causal LM over a batched, in-place KV cache.

One forward serves prefill, plain decoding and verification: it appends tokens to the cache and
returns logits for every appended position. Rejected draft positions are removed again with
:meth:`ModelRunner.rollback` (every row) or :meth:`ModelRunner.rollback_rows` (per row).
:meth:`ModelRunner.forward` runs one request; :meth:`ModelRunner.forward_rows` runs a batch
whose requests have different cache lengths and append different numbers of tokens.

Two extension points for the draft-head methods:

- ``hidden_layers`` names the hidden states each forward returns beside its logits
  (:class:`~specdec.hidden_states.HiddenStates`: ``hidden_states[i]`` enters decoder layer ``i``;
  ``[-1]`` is the final normed state), so EAGLE-3, Medusa and MTP get their features from the
  verify pass with no extra forward, and only the layers they read are kept.
- ``position_ids`` and a 4-D ``attention_mask`` pass through to the model, so a draft tree is
  verified in one forward: tokens are laid out flat, each at ``cache_len + depth``, and each
  attends to the cache and to its own ancestors only.

Sliding-window attention layers see, from each query, only the keys of the last ``window``
positions, its own included, as transformers masks them; the cache keeps every position
(:mod:`specdec.kv_cache`), so the masks this runner builds hide the rest. A model mixing full and
sliding layers gets one mask per layer type, ``{"full_attention": ..., "sliding_attention": ...}``,
the mapping transformers' hybrid models take in place of a mask; a model whose layers all slide
gets the sliding mask alone.

A model on transformers' ``sdpa`` attention is switched to :mod:`specdec.attention`'s, which runs
the same attention without copying the KV cache per query head in multi-token forwards, and its
bfloat16 linear layers on CPU multiply by prepacked weights (:mod:`specdec.prepacked_linear`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec.attention import use_packed_attention
from specdec.errors import ModelLoadError
from specdec.hidden_states import HiddenStates
from specdec.kv_cache import (
    KEY_BLOCK, BatchKVCache, ScatterPlan, attention_layer_types, check_model_supported, context_length, new_kv_cache,
    padded_key_length, sliding_window,
)
from specdec.prepacked_linear import prepack_linears
from specdec.static_cache import StaticKVCache
from specdec.static_forward import StaticForward, resolve_execution, use_recordable_experts, width_buckets
from specdec.tree_layout import TileLayout, tile_aligned_layout

if TYPE_CHECKING:
    from specdec.requests import DraftProposal

log = logging.getLogger("specdec.runner")


@dataclass
class RunnerOutput:
    logits: torch.Tensor
    hidden_states: HiddenStates | None = None


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache under (a model's, or one decoder layer's).

    Recent transformers releases (5.24 here) take it as ``cache`` and warn that
    ``past_key_values`` goes in 5.40; earlier 5.x releases know only ``past_key_values``.
    """
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ModelRunner:
    """Runs ``model``'s forwards for a decoding engine.

    :param execution: how the batch's forwards run (:mod:`specdec.static_forward`): ``auto``
        (CUDA graphs on CUDA, eager elsewhere), ``eager``, ``cuda_graph``, ``compile`` or ``static``.
        Prefill always runs eagerly; the captured modes take effect for the cache
        :meth:`new_batch_cache` hands out, once :meth:`prepare` has sized it.
    :param max_model_len: the most positions a request may hold (default: the model's context);
        a static cache reserves this many per row.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        hidden_layers: Sequence[int] = (),
        execution: str = "eager",
        max_model_len: int | None = None,
    ) -> None:
        check_model_supported(model)
        self.model = model.eval()
        use_packed_attention(model)
        #: How many of the model's linear layers multiply by prepacked weights.
        self.prepacked_linears = prepack_linears(model)
        #: How many hidden states the model's forward has: one per decoder layer and the final one.
        self.hidden_state_count = int(model.config.get_text_config().num_hidden_layers) + 1
        self.hidden_layers = hidden_layers
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_length = context_length(model.config)
        if max_model_len is not None:
            if max_model_len < 2:
                raise ValueError(f"max_model_len: at least 2 positions, not {max_model_len}")
            self.max_length = min(self.max_length, max_model_len)
        self.execution = resolve_execution(execution, self.device)
        self._chosen_by_default = execution == "auto"
        self._static: StaticForward | None = None
        #: The window of the model's sliding-window layers (``None``: it has none), and whether
        #: it also has full-attention layers (then each layer type gets its own mask).
        self.sliding_window = sliding_window(model.config)
        self.mixed_attention = len(set(attention_layer_types(model.config))) > 1
        self._cache_keyword = cache_keyword(model)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The hidden states every forward returns (:class:`~specdec.hidden_states.HiddenStates`),
        ascending in ``0 .. hidden_state_count - 1``; empty: none. Set it from any indices (negative
        ones count from the end)."""
        return self._hidden_layers

    @hidden_layers.setter
    def hidden_layers(self, layers: Sequence[int]) -> None:
        count = self.hidden_state_count
        if any(not -count <= i < count for i in layers):
            raise ValueError(f"hidden_layers: {list(layers)} must lie in -{count}..{count - 1} ({count - 1} decoder layers and the final state)")
        self._hidden_layers = tuple(sorted({i % count for i in layers}))

    @property
    def aligned_trees(self) -> bool:
        """Whether tree rows are laid out tile-aligned (:mod:`specdec.tree_layout`): on the eager
        path in bfloat16 on a CPU with oneDNN's bfloat16 kernels, where chains are batch
        invariant and this gives each tree node its chain's bits too."""
        return self.device.type == "cpu" and self.prepacked_linears > 0 and not self.static

    def fit_tree(self, proposal: DraftProposal, start: int) -> DraftProposal:
        """``proposal`` cut to the leading nodes a verify forward from cache length ``start`` lays
        out tile-aligned (all of them where trees are not aligned, and for chains)."""
        if proposal.parents is None or not self.aligned_trees:
            return proposal
        return proposal.truncated(tile_aligned_layout((-1, *(p + 1 for p in proposal.parents)), start).size - 1)

    def tree_slots(self, parents: list[int], start: int) -> list[int]:
        """Where a verify forward from cache length ``start`` writes each token of a tree row
        (``parents`` as :meth:`forward_rows` takes them, the root first), counted from
        ``start``: the tokens' own slots."""
        layout = self._tile_layout(parents, start, len(parents))
        return list(range(len(parents))) if layout is None else list(layout.slots)

    def _tile_layout(self, parents: list[int] | None, start: int, length: int) -> TileLayout | None:
        """A tree row's tile-aligned layout, or ``None`` to write the row flat: a chain, trees
        where they are not aligned, and a tree that was not cut to fit (:meth:`fit_tree`)."""
        if parents is None or not self.aligned_trees:
            return None
        layout = tile_aligned_layout(tuple(parents), start)
        return layout if layout.size >= length else None

    def new_cache(self, rows: int = 1) -> BatchKVCache:
        """An empty ordinary cache for ``rows`` requests (a prefill's; ``rows=0`` for a batch that
        requests join later)."""
        return new_kv_cache(self.model.config, rows)

    @property
    def static(self) -> bool:
        """Whether batch forwards take the static-shape path (every mode but ``eager``)."""
        return self.execution != "eager"

    @torch.inference_mode()
    def prepare(self, max_rows: int, max_width: int, show_progress: bool = False) -> None:
        """Size the batch cache for ``max_rows`` requests forwarding up to ``max_width`` tokens
        each (a verify's drafts and the token before them), and record the forward of every
        bucketed shape now, in the captured modes. Eager mode has nothing to prepare."""
        if not self.static:
            return
        end = self.max_length + width_buckets(max_width)[-1]
        # On the CPU the eager path's whole key blocks, so that the longest length bucket (the whole
        # capacity) multiplies its keys as the eager path does: the same bits. Elsewhere whole tiles.
        capacity = padded_key_length(end) if self.device.type == "cpu" else -(-end // KEY_BLOCK) * KEY_BLOCK
        cache = StaticKVCache(self.model.config, max_rows, capacity)
        self._static = StaticForward(
            self.execution, cache, self._forward_static, _visibility, self._static_layer_masks, self.dtype, self.device, max_width
        )
        try:
            if self._static.captures:
                use_recordable_experts(self.model, self.dtype)
            self._static.capture_all(self.hidden_layers, show_progress)
        except Exception as exc:
            if not self._chosen_by_default:
                raise ModelLoadError(f"execution: capturing {self.execution} forwards failed: {type(exc).__name__}: {exc}") from exc
            # A model whose forward syncs with the host (data-dependent shapes, as some
            # mixture-of-experts routers have) cannot be recorded: it runs eagerly instead.
            log.warning("capturing %s forwards failed (%s: %s); running every forward eagerly",
                        self.execution, type(exc).__name__, exc)
            self.execution, self._static = "eager", None

    @property
    def static_memory(self) -> dict[str, int] | None:
        """Device memory of the static path (its KV cache, and what capture took on CUDA);
        ``None`` when forwards run eagerly."""
        return self._static.memory if self._static is not None else None

    def new_batch_cache(self, rows: int = 0) -> BatchKVCache:
        """The cache a batch of ``rows`` requests decodes in (rows join later with ``rows=0``).

        With a static path this is always the same :class:`~specdec.static_cache.StaticKVCache`,
        emptied: the forwards recorded by :meth:`prepare` write to its buffers. One batch at a
        time decodes in it.
        """
        if self._static is None:
            if self.static:
                raise RuntimeError("ModelRunner.prepare() sizes the static batch cache before its first use")
            return self.new_cache(rows)
        cache = self._static.cache
        if rows > cache.max_rows:
            raise ValueError(f"{rows} requests in a static KV cache of {cache.max_rows} rows")
        cache.reset()
        cache.lengths = [0] * rows
        return cache

    @torch.inference_mode()
    def forward(
        self,
        cache: DynamicCache,
        token_ids: list[int],
        *,
        last_only: bool = False,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> RunnerOutput:
        """Append ``token_ids`` to ``cache``; logits (fp32, ``[n, vocab]``) for each of them.

        ``last_only`` computes logits for the last position only (prefill). An ``attention_mask``
        is additive, ``[1, 1, n, cache + n]``, as :func:`tree_attention` makes it; sliding-window
        layers get it with the keys outside each token's window hidden as well.
        """
        if isinstance(cache, StaticKVCache) and (position_ids is not None or attention_mask is not None):
            raise ValueError("a static KV cache takes trees through forward_rows, not position_ids / attention_mask")
        continues = isinstance(cache, BatchKVCache) and cache.get_seq_length() > 0 and attention_mask is None
        if isinstance(cache, StaticKVCache) or (continues and position_ids is None):
            # Decoding and verifying one request run as a batch of one, for its padded key
            # length: a token's bits then do not depend on the forward's width (a prefill into
            # an empty cache is the same computation however the request decodes after it).
            output = self.forward_rows(cache, [token_ids])[0]
            return RunnerOutput(output.logits[-1:], output.hidden_states) if last_only else output
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        # Trees built on the host (tree_attention's default) run on the model's device.
        position_ids = None if position_ids is None else position_ids.to(self.device)
        attention_mask = None if attention_mask is None else attention_mask.to(self.device)
        if attention_mask is not None and self.sliding_window is not None:
            start = cache.get_seq_length()
            positions = torch.arange(start, start + len(token_ids))[None] if position_ids is None else position_ids
            keys = torch.arange(attention_mask.shape[-1])[None].clone()
            keys[0, start : start + len(token_ids)] = positions[0].cpu()
            attention_mask = self._layer_masks(attention_mask, positions, keys)
        out = self.model(
            input_ids=input_ids,
            **{self._cache_keyword: cache},
            use_cache=True,
            position_ids=position_ids,
            attention_mask=attention_mask,
            output_hidden_states=bool(self.hidden_layers),
            logits_to_keep=1 if last_only else 0,
        )
        if isinstance(cache, BatchKVCache):
            cache.advance([len(token_ids)])
        hidden = self._kept(out.hidden_states).map(lambda h: h[0]) if self.hidden_layers else None
        return RunnerOutput(out.logits[0].float(), hidden)

    @torch.inference_mode()
    def forward_rows(
        self, cache: BatchKVCache, rows: list[list[int]], parents: list[list[int] | None] | None = None
    ) -> list[RunnerOutput]:
        """Append ``rows[b]`` to request ``b`` of a batch; each row's logits ``[len(rows[b]), vocab]``.

        Rows are padded to the longest, and the keys attended over to whole
        :data:`~specdec.kv_cache.KEY_BLOCK` blocks (:func:`~specdec.kv_cache.padded_key_length`),
        so that a token's logits have the same bits however many tokens and rows the forward
        holds. Row ``b``'s tokens are written at ``cache.lengths[b]``
        onward and attend only to that row's own cache and their own predecessors, so each row's
        logits equal a forward of that request alone: bit for bit in bfloat16 on a CPU with
        oneDNN's bfloat16 kernels (for chains; a tree node's keys lie elsewhere than its chain's),
        to floating-point summation order elsewhere.
        Padding writes cache entries past the row's new length, which its next forward overwrites.

        ``parents[b]``, when given, makes row ``b`` a tree: ``parents[b][j]`` is the index within
        the row of token ``j``'s parent (``-1`` for the first token, the root). Each token then sits
        at ``cache.lengths[b] + depth`` and attends to the cache and its own ancestors; ``None``
        (or no ``parents``) is a chain.
        """
        if len(rows) != cache.num_rows:
            raise ValueError(f"{len(rows)} rows of tokens for a cache of {cache.num_rows} requests")
        if isinstance(cache, StaticKVCache):
            return self._forward_rows_static(cache, rows, parents)
        width = max(len(r) for r in rows)
        starts = cache.lengths
        input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=self.device)
        layouts = [self._tile_layout(parents[b] if parents is not None else None, start, len(rows[b])) for b, start in enumerate(starts)]
        ends = [start + (width if layout is None else layout.span) for start, layout in zip(starts, layouts)]
        kv_length = padded_key_length(max(ends))
        allowed = torch.arange(kv_length)[None, None, :] < torch.tensor(starts)[:, None, None]
        allowed = allowed.expand(len(rows), width, kv_length).clone()
        keys = torch.arange(kv_length).repeat(len(rows), 1) if self.sliding_window is not None else None
        depths = []
        for b, (start, layout) in enumerate(zip(starts, layouts)):
            row_parents = parents[b] if parents is not None else None
            visible, depth = _visibility(row_parents, width)
            depths.append([start + d for d in depth])
            if layout is None:
                allowed[b, :, start : start + width] = visible
                if keys is not None:
                    keys[b, start : start + width] = torch.tensor(depths[b])
                continue
            for j in range(width):  # padding past the tree's tokens sees the root alone
                allowed[b, j, [start + s for s in (layout.visible[j] if j < layout.size else (0,))]] = True
                if j < layout.size and layout.committed[j] is not None:
                    allowed[b, j, start + layout.committed[j] : start] = False
            if keys is not None:
                for j, slot in layout.writes:
                    keys[b, start + slot] = start + depth[j]
                for source, slot in layout.copies:
                    keys[b, start + slot] = start + source
        position_ids = torch.tensor(depths)
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        mask = mask.to(self.device)
        cache.attend = kv_length
        if any(layout is not None for layout in layouts):
            cache.scatter = _scatter_plan(starts, layouts, width, self.device)
        try:
            out = self.model(
                input_ids=input_ids,
                **{self._cache_keyword: cache},
                use_cache=True,
                position_ids=position_ids.to(self.device),
                attention_mask=self._layer_masks(mask[:, None], position_ids, keys),
                output_hidden_states=bool(self.hidden_layers),
            )
        finally:
            cache.attend = None
            cache.scatter = None
        cache.advance([len(r) for r in rows])
        logits = out.logits.float()
        return _row_outputs(rows, logits, self._kept(out.hidden_states) if self.hidden_layers else None)

    def _forward_rows_static(
        self, cache: StaticKVCache, rows: list[list[int]], parents: list[list[int] | None] | None
    ) -> list[RunnerOutput]:
        if self._static is None or cache is not self._static.cache:
            raise ValueError("a static KV cache runs forwards only on the runner that made it (new_batch_cache)")
        logits, hidden = self._static.run(rows, parents, self.hidden_layers)
        cache.advance([len(r) for r in rows])
        kept = HiddenStates(dict(zip(self.hidden_layers, hidden)), self.hidden_state_count) if hidden is not None else None
        return _row_outputs(rows, logits, kept)

    def _kept(self, states: tuple[torch.Tensor, ...]) -> HiddenStates:
        """The entries :attr:`hidden_layers` of a model output's ``hidden_states``."""
        return HiddenStates({i: states[i] for i in self.hidden_layers}, len(states))

    def _forward_static(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | dict[str, torch.Tensor],
        hidden_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The model call of the static path (:class:`~specdec.static_forward.StaticForward`)."""
        out = self.model(
            input_ids=input_ids,
            **{self._cache_keyword: self._static.cache},
            use_cache=True,
            position_ids=position_ids,
            attention_mask=attention_mask,
            output_hidden_states=bool(hidden_layers),
        )
        return out.logits.float(), (tuple(out.hidden_states[i] for i in hidden_layers) if hidden_layers else None)

    def _static_layer_masks(
        self, mask: torch.Tensor, position_ids: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """:meth:`_layer_masks` on the device, from each key's position ``[rows, kv]``."""
        if self.sliding_window is None:
            return mask
        outside = key_positions[:, None, :] <= position_ids[:, :, None] - self.sliding_window
        sliding = mask.masked_fill(outside[:, None], torch.finfo(mask.dtype).min)
        return {"full_attention": mask, "sliding_attention": sliding} if self.mixed_attention else sliding

    def _layer_masks(
        self, mask: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor | None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The model's ``attention_mask`` argument for an additive ``mask`` ``[rows, 1, q, kv]``
        over a forward of queries at ``position_ids`` ``[rows, q]`` and keys at positions ``keys``
        ``[rows, kv]`` (``None`` without sliding-window layers): ``mask`` itself without
        sliding-window layers, else ``mask`` with the keys outside each query's window hidden
        (alone, or with ``mask`` for full-attention layers).

        A sliding layer lets the query at position ``p`` see keys at positions ``p - window + 1``
        to ``p`` (transformers' ``sliding_window_overlay``). A cached entry sits at its position;
        a draft tree's tokens sit at their depths, wherever the forward writes them.
        """
        if self.sliding_window is None:
            return mask
        outside = keys[:, None, :] <= position_ids.cpu()[:, :, None] - self.sliding_window
        sliding = mask.masked_fill(outside[:, None].to(mask.device), torch.finfo(mask.dtype).min)
        return {"full_attention": mask, "sliding_attention": sliding} if self.mixed_attention else sliding

    @staticmethod
    def rollback(cache: DynamicCache, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` positions (rejected drafts) from every row of ``cache``."""
        if num_tokens > 0:
            cache.crop(-num_tokens)

    @staticmethod
    def rollback_rows(cache: BatchKVCache, counts: list[int]) -> None:
        """Drop the last ``counts[b]`` positions of row ``b``."""
        cache.rollback_rows(counts)

    @staticmethod
    def cache_length(cache: DynamicCache) -> int:
        return cache.get_seq_length()


def _row_outputs(rows: list[list[int]], logits: torch.Tensor, hidden: HiddenStates | None) -> list[RunnerOutput]:
    """Each row's outputs from a batched forward's, without the padding past the row's tokens."""
    outputs = []
    for b, r in enumerate(rows):
        row = (b, slice(0, len(r)))
        outputs.append(RunnerOutput(logits[row], hidden.map(itemgetter(row)) if hidden is not None else None))
    return outputs


def _scatter_plan(starts: list[int], layouts: list[TileLayout | None], width: int, device: torch.device) -> ScatterPlan:
    """Where a forward writes each row's tokens: a chain's (``None``) ``width`` tokens one after
    another from its start, a tiled tree's to every slot its layout gives them, after copying the
    committed entries its further segments repeat."""
    rows, slots, sources, copy_rows, copy_from, copy_to = [], [], [], [], [], []
    for b, (start, layout) in enumerate(zip(starts, layouts)):
        writes = [(j, j) for j in range(width)] if layout is None else layout.writes
        for j, slot in writes:
            rows.append(b)
            slots.append(start + slot)
            sources.append(j)
        for source, slot in layout.copies if layout is not None else ():
            copy_rows.append(b)
            copy_from.append(start + source)
            copy_to.append(start + slot)

    def index(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return ScatterPlan(index(rows), index(slots), index(sources), index(copy_rows), index(copy_from), index(copy_to))


def _visibility(parents: list[int] | None, width: int) -> tuple[torch.Tensor, list[int]]:
    """Which of a row's ``width`` new tokens each one sees (itself and its ancestors), and depths.

    Padding past a tree's tokens sees only itself and the root.
    """
    if parents is None:
        return torch.ones(width, width, dtype=torch.bool).tril_(), list(range(width))
    visible = torch.eye(width, dtype=torch.bool)
    visible[:, 0] = True
    depth = [0] * width
    for j, parent in enumerate(parents):
        if j == 0:
            if parent != -1:
                raise ValueError("a tree row's first token is its root: its parent must be -1")
            continue
        if not 0 <= parent < j:
            raise ValueError(f"parents[{j}] = {parent}: a parent must come before its child")
        visible[j] |= visible[parent]
        depth[j] = depth[parent] + 1
    for j in range(len(parents), width):
        depth[j] = 1
    return visible, depth


def tree_attention(
    parents: list[int], cache_length: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``position_ids`` and a 4-D additive attention mask to verify a draft tree in one forward.

    The tree's tokens are laid out flat; ``parents[i]`` is the index of node ``i``'s parent in that
    layout (``-1`` for a child of the last committed token). Each node sits at
    ``cache_length + depth`` and attends to the whole cache and to its own ancestors only, so
    its logits equal those of a chain forward along its path.
    """
    n = len(parents)
    depth = [0] * n
    allowed = torch.zeros(n, cache_length + n, dtype=torch.bool)
    allowed[:, :cache_length] = True
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent}: a parent must come before its child")
        if parent >= 0:
            depth[i] = depth[parent] + 1
            allowed[i] = allowed[parent]
        allowed[i, cache_length + i] = True
    position_ids = torch.tensor([[cache_length + d for d in depth]], device=device)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return position_ids, mask[None, None].to(device)
