"""Chain drafting with MTP layers, each depth keeping its own KV cache per request.

Depth ``k`` (1-based; layer ``min(k, n) - 1`` of ``n`` loaded layers, the last one reused past
``n`` as vLLM does) at position ``i`` reads depth ``k - 1``'s output there (for ``k = 1`` the
target's final hidden state, after its final norm, as vLLM feeds ``deepseek_mtp``) and token
``i + k``. With ``N`` tokens known, the target's states cover positions ``0 .. N - 2`` (token
``N - 1`` is forwarded with the drafts), so each draft step ``k`` runs depth ``k`` over its
uncached positions up to ``N - 2`` and drafts token ``N - 1 + k``
from the last one. Positions ``i >= N - k`` read a drafted token; they are rolled back (cropped)
after the step, so every cache holds only positions built from true tokens and states, and the
next step recomputes them from the accepted tokens (catch-up). Each depth also keeps its true
outputs that the next depth has not cached yet, since that depth reads them. A depth runs once for
the whole batch, its requests' caches side by side (:class:`~specdec.RaggedDraftBatch`), as
EAGLE-3's head does.

The target's states come from its own forwards at no extra cost: the prefill covers the prompt,
and each verify forward covers the last token and the drafts, of which ``accept`` keeps the rows
of the tokens that stayed.

With relaxed acceptance on, each request also tracks whether its tokens leave a thinking span
open (:class:`~specdec_mtp.relaxed.ThinkingSpan`), for the plugin's ``specdec_verify``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec import (
    ConfigError,
    DraftProposal,
    HiddenStateResources,
    RaggedDraftBatch,
    RecordedCalls,
    Request,
    StaticDraftCache,
    TargetContext,
    VerifyResult,
    catch_up,
    draft_vocabulary,
    drafter_checkpoint,
    greedy_tokens,
    is_default_model,
    pick_drafts,
    prepack_linears,
    trimmed_projection,
)
from specdec_mtp.checkpoint import load_mtp_layers
from specdec_mtp.config import MTPDecodingConfig
from specdec_mtp.layer import BlockCache, LatentCache, MTPLayer, block_classes
from specdec_mtp.relaxed import ThinkingSpan, thinking_tokens

logger = logging.getLogger(__name__)


@dataclass
class Depth:
    """One depth's cache and its true outputs for positions ``start`` .. ``cache.length - 1``
    (``start`` is the next depth's cache length)."""

    cache: LatentCache = field(default_factory=LatentCache)
    outputs: torch.Tensor | None = None
    start: int = 0


@dataclass
class MTPState:
    """One request's depths, the target's final states for positions ``target_start`` on, and its
    thinking span when relaxed acceptance is on."""

    depths: list[Depth]
    target: list[torch.Tensor]
    target_start: int = 0
    thinking: ThinkingSpan | None = None


#: The MTP layer trained for the default target (``specdec train mtp``; docs/mtp.md has the recipe).
SHIPPED_LAYER = Path(__file__).resolve().parent / "weights" / "smollm2-mtp"


def checkpoint_dir(config: MTPDecodingConfig, target: TargetContext) -> Path:
    """``speculative_model``; else, for the default target (which has no MTP layers), the layer
    this package ships for it; else the directory the target was loaded from."""
    if not config.speculative_model and is_default_model(target.model):
        return Path(drafter_checkpoint(None, target.model, SHIPPED_LAYER, "an MTP layer", "specdec-plugin-mtp"))
    source = config.speculative_model or getattr(target.model, "name_or_path", "") or ""
    path = Path(source)
    if not source or not path.is_dir():
        raise ConfigError(
            "speculative_model: the MTP layers are read from the target's checkpoint directory, but the target was "
            f"not loaded from a local directory ({source!r}); set speculative_model to the directory that holds them"
        )
    return path


def layer_count(config: MTPDecodingConfig, target: TargetContext, directory: Path) -> int:
    """``num_nextn_predict_layers``: the option, else that of the ``config.json`` in ``directory``
    (a ``specdec train mtp`` export, or the target's own checkpoint), else the target config's."""
    saved = directory / "config.json"
    stored = json.loads(saved.read_text()).get("num_nextn_predict_layers") if saved.is_file() else None
    count = config.num_nextn_predict_layers or stored or getattr(target.model.config, "num_nextn_predict_layers", 0) or 0
    if count < 1:
        raise ConfigError(
            "num_nextn_predict_layers: the target's config has no MTP layers (num_nextn_predict_layers is 0 or absent); "
            "set the option if the checkpoint holds them"
        )
    return count


class MTPResources(HiddenStateResources):
    """The loaded MTP layers and per-request :class:`MTPState` in ``request.method_state``."""

    def __init__(self, config: MTPDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        target_config = target.model.config
        block_classes(target_config)  # an architecture MTP blocks cannot be built for fails first
        directory = checkpoint_dir(config, target)
        layers = load_mtp_layers(directory, target_config, layer_count(config, target, directory))
        self.config = config
        self.layers = [layer.to(target.device, target.dtype) for layer in layers]
        for layer in self.layers:
            prepack_linears(layer)
            if layer.shared_head.head is None:
                layer.shared_head.head = target.model.get_output_embeddings()
        #: The target ids the layers draft over (a draft vocabulary), ``None`` for all of them; the
        #: layer shipped for the default target drafts over the shipped one unless told otherwise.
        self.kept = draft_vocabulary(config, target, shipped=not config.speculative_model and is_default_model(target.model))
        if self.kept is not None:
            trimmed: dict[int, torch.nn.Module] = {}  # layers sharing a head share its trimmed copy
            for layer in self.layers:
                head = layer.shared_head.head
                if id(head) not in trimmed:
                    trimmed[id(head)] = trimmed_projection(head, self.kept)
                layer.shared_head.head = trimmed[id(head)]
            self.kept = self.kept.to(target.device)
        self.vocab_size = target.vocab_size
        self.target_embed = target.model.get_input_embeddings()
        self.rotary = target.model.get_decoder().rotary_emb
        self.device = target.device
        # Where the target's forwards run in fixed shapes, a batch of greedy chains drafts every
        # depth in fixed shapes too, recorded once per shape and replayed where the target's forwards
        # are (CUDA graphs; specdec.static_draft), into a cache shaped at first use like the depths'.
        self.recorded = RecordedCalls.like_target(target, self.setup_clock)
        if self.recorded is not None and self.recorded.mode == "cuda_graph" and any(
            hasattr(layer.block.mlp, "experts") for layer in self.layers
        ):
            # A mixture-of-experts block (DeepSeek-V3's) routes tokens in shapes that depend on the
            # data, which a CUDA graph cannot record.
            logger.info("MTP: the layers' mixture-of-experts blocks cannot be recorded as CUDA graphs; drafting eagerly")
            self.recorded = None
        self.static_cache: StaticDraftCache | None = None
        self._static_rows, self._static_capacity = target.max_batch_size, target.runner.max_length + 3 * config.max_draft_len
        #: The thinking span's begin and end token ids, when relaxed acceptance is on.
        self.thinking: tuple[int, int] | None = None
        if not config.lossless:
            self.thinking = thinking_tokens(
                config.begin_thinking_phase_token, config.end_thinking_phase_token, target.tokenizer, target.vocab_size
            )
            logger.warning(
                "MTP relaxed acceptance is on: output inside thinking spans is NOT the target's "
                "(relaxed_topk=%s, relaxed_delta=%s, thinking tokens %s..%s)",
                config.relaxed_topk, config.relaxed_delta, *self.thinking,
            )

    def layer(self, depth: int) -> MTPLayer:
        """The layer of draft depth ``depth`` (1-based): the last one past the loaded count."""
        return self.layers[min(depth, len(self.layers)) - 1]

    def add_request(self, request: Request) -> None:
        depths = [Depth() for _ in range(self.config.max_draft_len)]
        thinking = ThinkingSpan(*self.thinking) if self.thinking else None
        request.method_state = MTPState(depths, [request.target_output.hidden_states[-1]], thinking=thinking)

    def release(self) -> None:
        self.layers = self.target_embed = self.rotary = self.recorded = self.static_cache = None
        super().release()

    def commit(self, request: Request, result: VerifyResult) -> None:
        """Queue the target's final states of the last token and the accepted drafts."""
        if not request.finished:
            request.method_state.target.append(request.target_output.hidden_states[-1][: result.num_accepted + 1])

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        """Each request's chain of up to ``request.max_draft_len`` tokens: argmax, or sampled with its
        distributions. Each depth runs once for the batch (:meth:`_depth`)."""
        proposals = [DraftProposal() for _ in requests]
        chains = [_Chain(b, r, min(self.config.max_draft_len, r.max_draft_len)) for b, r in enumerate(requests)]
        chains = [c for c in chains if c.length > 0]
        eager = chains
        if self.recorded is not None and (plan := self._plan(chains)):
            self._draft_recorded(list(plan), list(plan.values()))
            eager = [c for c in chains if c not in plan]
        for k in range(1, max((c.length for c in eager), default=0) + 1):
            active = [c for c in eager if c.length >= k]
            runs = self._depth(k, active)
            logits = self.layer(k).logits(torch.stack([out[-1] for _, out in runs]))
            picks = pick_drafts(logits, [c.request for c in active], [k - 1] * len(active), self.kept, self.vocab_size)
            for chain, (start, out), pick in zip(active, runs, picks):
                chain.drafted(k, start, out, *pick)
        for chain in chains:
            state: MTPState = chain.request.method_state
            first = state.depths[0].cache.length
            target = torch.cat(state.target)
            state.target = [target[first - state.target_start :]]
            state.target_start = first
            proposals[chain.index] = DraftProposal(chain.drafts, torch.stack(chain.probs) if chain.probs else None)
        return proposals

    def _depth(self, k: int, chains: list[_Chain]) -> list[tuple[int, torch.Tensor]]:
        """Depth ``k`` over each chain's uncached positions up to the last known token's; returns
        each chain's first position and outputs there. Chains a step or two behind run in one
        forward; one further behind (just added, or drafting was paused for it) runs alone, timed as
        setup (:func:`specdec.catch_up`)."""
        steady = self.config.max_draft_len + k  # a steady step leaves depth k this far behind at most
        return catch_up([chain.behind(k) for chain in chains], steady,
                        lambda rows: self._forward(k, [chains[i] for i in rows]), self.setup_clock)

    def _forward(self, k: int, chains: list[_Chain]) -> list[tuple[int, torch.Tensor]]:
        """One forward of depth ``k`` over the chains' positions, padded to the most; each depth's
        cache takes only the positions built from true tokens and states (from ``len(token_ids) - k``
        on, a position reads a drafted token)."""
        layer, depths = self.layer(k), [c.request.method_state.depths[k - 1] for c in chains]
        starts, counts = [d.cache.length for d in depths], [c.behind(k) for c in chains]
        width = max(counts)
        token_ids = torch.zeros(len(chains), width, dtype=torch.long)
        previous = chains[0].previous.new_zeros(len(chains), width, chains[0].previous.shape[-1])
        for b, (chain, start, count) in enumerate(zip(chains, starts, counts)):
            token_ids[b, :count] = torch.tensor(chain.tokens[start + k : start + k + count])
            previous[b, :count] = chain.previous[start - chain.previous_start :]
        positions = (torch.tensor(starts)[:, None] + torch.arange(width)[None]).to(self.device)
        batch = RaggedDraftBatch([[d.cache] for d in depths], width, self.device)
        allowed = batch.extend(torch.arange(width)[None] < torch.tensor(counts)[:, None])
        embeds = (layer.embed_tokens or self.target_embed)(token_ids.to(self.device))
        mask = None
        if allowed is not None:
            mask = torch.zeros(allowed.shape, dtype=embeds.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(embeds.dtype).min)
        out = layer(embeds, previous, positions, self.rotary(embeds, positions), BlockCache(batch.layer(0)), mask)
        for b, (chain, depth, start) in enumerate(zip(chains, depths, starts)):
            if (true := len(chain.request.token_ids) - k - start) > 0:
                depth.cache.append(*batch.appended(b, true)[0])
        return [(start, out[b, :count]) for b, (start, count) in enumerate(zip(starts, counts))]

    def _width(self, k: int) -> int:
        """The positions depth ``k`` runs in fixed shapes: room for a steady step's (at most
        ``max_draft_len + k``, what :meth:`_depth` runs together) and for as many again, which a
        depth the policy's shorter chains skipped for a step or two needs."""
        return 2 * self.config.max_draft_len + k

    def _plan(self, chains: list[_Chain]) -> dict[_Chain, list[int]]:
        """The chains that draft in fixed shapes this step, each with its inputs of
        :meth:`_chain_loop` (a row of integers, laid out as it reads them): the greedy ones at most
        :meth:`_width` positions behind at every depth they draft. The others (a request far
        behind, as after its prompt) take the eager depths, which catch it up alone. The static
        cache is made at the first step where a depth's cache holds anything, shaped like it."""
        if self.static_cache is None:  # shaped like the depths' caches, once one holds anything
            cached = next((kv for c in chains for d in c.request.method_state.depths if (kv := d.cache.cached())), None)
            if cached is None:
                return {}
            keys, values = cached
            self.static_cache = StaticDraftCache(
                self.config.max_draft_len, self._static_rows, keys.shape[1], keys.shape[3], self._static_capacity,
                keys.dtype, self.device, value_shape=(values.shape[1], values.shape[3]),
            )
        greedy = [c for c in chains if c.request.params.greedy]
        deepest = max((c.length for c in greedy), default=0)
        plan = {c: row for c in greedy if (row := self._row(c, deepest)) is not None}
        depth = max((c.length for c in plan), default=0)
        if depth < deepest:  # the rows' padding follows the deepest chain among them
            plan = {c: self._row(c, depth) for c in plan}
        return plan

    def _row(self, chain: _Chain, depth: int) -> list[int] | None:
        """``chain``'s inputs of :meth:`_chain_loop` for ``depth`` depths, or ``None`` if a depth
        it drafts is too far behind for the fixed widths."""
        depths, known, row = chain.request.method_state.depths, len(chain.request.token_ids), []
        for k in range(1, depth + 1):
            width, start, count = self._width(k), depths[k - 1].cache.length, chain.behind(k)
            if k > chain.length:  # this chain stops short of depth k: its row there is padding
                row += [0] * width * 3 + list(range(start, start + width)) + [0] * (1 + (k > 1) * width)
                continue
            if not 0 < count <= width:
                return None
            ahead = [start + j + k - known for j in range(count)]  # >= 0: reads draft ahead + 1
            row += [chain.tokens[start + j + k] if a < 0 else 0 for j, a in enumerate(ahead)] + [0] * (width - count)
            row += [int(a >= 0) for a in ahead] + [0] * (width - count)
            row += [max(a, 0) for a in ahead] + [0] * (width - count)
            row += list(range(start, start + width)) + [count - 1]
            if k > 1:  # where depth k - 1's outputs are: kept from earlier steps, then this step's
                before, ran = depths[k - 2], depths[k - 2].cache.length
                first = before.start if before.outputs is not None else ran
                kept = before.outputs.shape[0] if before.outputs is not None else 0
                index = [p - first if p < ran else width + p - ran for p in range(start, start + count)]
                if kept > width or any(not (0 <= i < kept or width <= i < width + chain.behind(k - 1)) for i in index):
                    return None
                row += index + [0] * (width - count)
        return row

    def _draft_recorded(self, chains: list[_Chain], plan: list[list[int]]) -> None:
        """Every depth for the batch in one call of :meth:`_chain_loop`, in fixed shapes (recorded
        once per shape on CUDA and replayed), its drafts read once; then each depth's true
        positions go into the requests' caches and each chain takes its drafts and outputs, as
        the eager depths do."""
        depth = max(c.length for c in chains)
        states: list[MTPState] = [c.request.method_state for c in chains]
        cache = self.static_cache
        cache.load([[d.cache for d in state.depths[:depth]] for state in states])
        starts = [[state.depths[k - 1].cache.length for state in states] for k in range(1, depth + 1)]
        counts = [[c.behind(k) for c in chains] for k in range(1, depth + 1)]
        reach = max(start + self._width(k + 1) for k, column in enumerate(starts) for start in column)
        rows, key_length = cache.shape_for(len(chains), reach)
        ints = torch.zeros(rows, len(plan[0]), dtype=torch.long)
        ints[: len(chains)] = torch.tensor(plan)
        for b in range(len(chains), rows):  # padding rows write positions from 0 on
            column = 0
            for k in range(1, depth + 1):
                width = self._width(k)
                ints[b, column + 3 * width : column + 4 * width] = torch.arange(width)
                column += 4 * width + 1 + (k > 1) * width
        previous = [chains[0].previous.new_zeros(rows, self._width(k), chains[0].previous.shape[-1]) for k in range(1, depth + 1)]
        for b, (chain, state) in enumerate(zip(chains, states)):
            first = starts[0][b] - chain.previous_start
            previous[0][b, : counts[0][b]] = chain.previous[first : first + counts[0][b]]
            for k in range(2, chain.length + 1):
                if (kept := state.depths[k - 2].outputs) is not None:
                    previous[k - 1][b, : kept.shape[0]] = kept

        def loop(ints: torch.Tensor, *previous: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._chain_loop(ints, previous, depth, key_length)

        picks, *outs = self.recorded((rows, depth, key_length), loop, [ints.to(self.device), *previous])
        picks = picks[: len(chains)].tolist()
        outs = [out[: len(chains)].clone() for out in outs]  # the next replay rewrites them
        for k in range(1, depth + 1):
            keys, values = cache.keys[k - 1], cache.values[k - 1]
            for b, (chain, state) in enumerate(zip(chains, states)):
                if chain.length < k:
                    continue
                start = starts[k - 1][b]
                if (true := len(chain.request.token_ids) - k - start) > 0:
                    state.depths[k - 1].cache.append(keys[b : b + 1, :, start : start + true],
                                                     values[b : b + 1, :, start : start + true])
                chain.drafted(k, start, outs[k - 1][b, : counts[k - 1][b]], picks[b][k - 1], None)

    def _chain_loop(self, ints: torch.Tensor, previous: tuple[torch.Tensor, ...], depth: int,
                    key_length: int) -> tuple[torch.Tensor, ...]:
        """``[rows, depth]`` greedy drafts and each depth's outputs ``[rows, width, hidden]``, every
        depth over the static cache, nothing read back to the host. ``ints`` holds each row's plan
        (:meth:`_plan`): per depth its tokens, which of them are drafts (and which draft), its
        positions, the slot it drafts from and, past depth 1, where its previous states are among
        the kept ones (``previous[k - 1]``) and depth ``k - 1``'s outputs; ``previous[0]`` holds
        the target's states."""
        hidden = previous[0].shape[-1]
        keys = torch.arange(key_length, device=self.device)
        picks: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        column = 0
        for k in range(1, depth + 1):
            width = self._width(k)
            tokens, from_draft, draft, positions = ints[:, column : column + 4 * width].reshape(-1, 4, width).unbind(1)
            last = ints[:, column + 4 * width]
            column += 4 * width + 1
            states = previous[0]
            if k > 1:
                index = ints[:, column : column + width]
                column += width
                tokens = torch.where(from_draft.bool(), torch.stack(picks, dim=1).gather(1, draft), tokens)
                both = torch.cat((previous[k - 1], outs[-1]), dim=1)
                states = both.gather(1, index[..., None].expand(-1, -1, hidden))
            layer = self.layer(k)
            embeds = (layer.embed_tokens or self.target_embed)(tokens)
            self.static_cache.write_at(positions, key_length)
            mask = torch.zeros(positions.shape[0], 1, width, key_length, dtype=embeds.dtype, device=self.device)
            mask.masked_fill_((keys[None, None] > positions[..., None])[:, None], torch.finfo(embeds.dtype).min)
            out = layer(embeds, states, positions, self.rotary(embeds, positions), BlockCache(self.static_cache.layer(k - 1)), mask)
            outs.append(out)
            ids = greedy_tokens(layer.logits(out.gather(1, last[:, None, None].expand(-1, 1, hidden))[:, 0]))
            picks.append(ids if self.kept is None else self.kept[ids])
        return (torch.stack(picks, dim=1), *outs)


class _Chain:
    """One request's chain while a step drafts it: its tokens (known, then drafted) and what the
    next depth reads (depth ``k - 1``'s outputs, the target's final states for ``k = 1``, from
    position ``previous_start`` on)."""

    def __init__(self, index: int, request: Request, length: int) -> None:
        state: MTPState = request.method_state
        self.index, self.request, self.length = index, request, length
        self.tokens = list(request.token_ids)
        self.previous = torch.cat(state.target) if len(state.target) > 1 else state.target[0]
        self.previous_start = state.target_start
        if self.previous_start + self.previous.shape[0] != len(self.tokens) - 1:
            raise RuntimeError(f"MTP state out of step: target states to {self.previous_start + self.previous.shape[0]} "
                               f"for {len(self.tokens)} tokens")
        self.drafts: list[int] = []
        self.probs: list[torch.Tensor] = []

    def behind(self, k: int) -> int:
        """Positions depth ``k`` runs this step: its uncached ones up to the last known token's."""
        return len(self.request.token_ids) - 1 - self.request.method_state.depths[k - 1].cache.length

    def drafted(self, k: int, start: int, out: torch.Tensor, token: int, dist: torch.Tensor | None) -> None:
        """Depth ``k`` ran positions ``start`` on, giving ``out``, and drafted ``token``."""
        self.tokens.append(token)
        self.drafts.append(token)
        if dist is not None:
            self.probs.append(dist)
        depths = self.request.method_state.depths
        depth = depths[k - 1]
        true_end = max(len(self.request.token_ids) - k, start)
        if depth.outputs is not None:
            self.previous, self.previous_start = torch.cat((depth.outputs, out)), depth.start
        else:
            self.previous, self.previous_start = out, start
        # Keep what the next depth will read at its next catch-up: its uncached true positions.
        keep = depths[k].cache.length if k < len(depths) else true_end
        depth.outputs = self.previous[keep - self.previous_start : true_end - self.previous_start]
        depth.start = keep
