"""Chain drafting with an EAGLE-3 head that keeps its own KV cache per request.

Head position ``j`` holds the pair (target features of position ``j``, token ``j + 1``); its output
predicts token ``j + 2``. The head's cache only ever keeps pairs built from *true* target
features, which come from the target's own forwards at no extra cost:

- ``add_request``: the prefill's hidden states cover every prompt position, and the first
  generated token is known, so every prompt position forms a pair.
- ``accept``: the verify forward covered the last token and every draft; the rows of the
  accepted drafts and the last token (``num_accepted + 1``) form the next pairs, with the
  bonus/recovered token as the last pair's token.

Those pairs wait in ``pending`` and enter the cache in one head forward when the next step
drafts (catch-up). Drafting then feeds the head its own output as the feature (EAGLE's chained
step). The running requests draft their chains together, one head forward per depth over a
:class:`specdec.kv_cache.RaggedDraftBatch` of their caches, so those positions never enter a
request's own cache; requests a step or two behind catch up together the same way.

With ``eagle_topk > 1`` greedy and seeded requests draft an EAGLE-2 tree (:class:`specdec.trees.TreeCandidates`): each
depth runs one head forward over the whole frontier, every node attending to the committed cache,
its ancestors' draft slots and itself; the draft slots are then cropped from the request's cache. The target
verifies the tree and keeps one root-down path, and ``accept`` takes the true features of exactly
that path's rows (for a seeded request, the path of the target's own draws). Sampled requests
without a seed draft a chain of ``max_draft_len`` tokens: the core's rejection sampler verifies
chains only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from specdec import (
    ConfigError,
    DraftProposal,
    HiddenStateResources,
    HiddenStates,
    RaggedDraftBatch,
    RecordedCalls,
    Request,
    RequestKV,
    StaticDraftCache,
    TargetContext,
    TreeCandidates,
    VerifyResult,
    catch_up,
    draft_ranking,
    drafter_checkpoint,
    greedy_tokens,
    kept_rows,
    pick_drafts,
    prepack_linears,
    trimmed_projection,
)
from specdec_eagle3.checkpoint import load_head
from specdec_eagle3.compat import resolve_layers
from specdec_eagle3.config import Eagle3DecodingConfig
from specdec_eagle3.head import HeadCache
from specdec_eagle3.tree import frontier_mask

#: The head trained for the default target by ``specdec train eagle3`` (see docs/eagle3.md).
SHIPPED_HEAD = Path(__file__).resolve().parent / "weights" / "smollm2-eagle3"


def head_source(config: Eagle3DecodingConfig, target: TargetContext) -> str:
    """The head named by ``config``, else the shipped one when the target is the default model."""
    return drafter_checkpoint(config.speculative_model, target.model, SHIPPED_HEAD, "an EAGLE-3 head", "specdec-plugin-eagle3")


@dataclass
class HeadState:
    """One request's head cache and the target features not yet in it (positions ``cached`` on).

    The engine retries each request alone when a call for the whole batch raised, so a request's
    draft step or accept may run twice, or after one that raised part-way: the cache may then
    hold positions past ``cached`` (dropped before drafting), and a draft step finds no pending
    pairs (it starts from ``last``), an accept its pairs queued already (it adds nothing).
    """

    cache: HeadCache = field(default_factory=HeadCache)
    pending: list[torch.Tensor] = field(default_factory=list)
    #: True pairs in the cache, its first positions.
    cached: int = 0
    #: The head's output at the last true pair in the cache, ``[1, 1, hidden]``.
    last: torch.Tensor | None = None

    @property
    def pairs(self) -> int:
        """True pairs known, cached or pending: one for every token but the last once in step."""
        return self.cached + sum(features.shape[0] for features in self.pending)


class Eagle3Resources(HiddenStateResources):
    """The loaded head, the fused target layers, and per-request head state in ``request.method_state``."""

    def __init__(self, config: Eagle3DecodingConfig, target: TargetContext) -> None:
        source = head_source(config, target)
        target_config = target.model.config
        head = load_head(source, target_hidden_size=int(target_config.hidden_size), target_vocab_size=target.vocab_size)
        self.layers = resolve_layers(config.eagle3_layers_to_capture, head.config, int(target_config.num_hidden_layers))
        super().__init__(target, layers=self.layers)
        if config.eagle_topk > head.config.draft_vocab_size:
            raise ConfigError(
                f"eagle_topk: {config.eagle_topk} exceeds the head's draft vocabulary of {head.config.draft_vocab_size} tokens"
            )
        self.config = config
        self.head = head.place(target.device, target.dtype)
        prepack_linears(self.head)
        self.embed = head.embed_tokens if head.embed_tokens is not None else target.model.get_input_embeddings()
        self.draft_ids = self.head.draft_to_target()
        # A draft vocabulary narrows the head's own (d2t) to its most used tokens. Not by default:
        # the shipped head's 16,384 tokens drafted as fast as 8,192 of them on mt_bench (the
        # smaller layer's saving went to the drafts it could no longer make).
        ranked = draft_ranking(config, target, shipped=config.speculative_model is None, shipped_size=None)
        if ranked is not None:
            rows = kept_rows(ranked[0], self.draft_ids, ranked[1])
            self.head.lm_head = trimmed_projection(self.head.lm_head, rows)
            self.draft_ids = self.draft_ids[rows.to(self.draft_ids.device)]
            if config.eagle_topk > len(rows):
                raise ConfigError(f"eagle_topk: {config.eagle_topk} exceeds draft_vocab_size {len(rows)}")
        self.vocab_size = target.vocab_size
        self.device = target.device
        # Where the target's forwards run in fixed shapes, greedy chains do too, recorded once per
        # shape and replayed where the target's forwards are (CUDA graphs; specdec.static_draft).
        self.static_cache: StaticDraftCache | None = None
        self.recorded = RecordedCalls.like_target(target, self.setup_clock)
        if self.recorded is not None:
            llama = self.head.config.llama
            self.static_cache = StaticDraftCache(
                self.head.config.num_layers, target.max_batch_size, int(llama.num_key_value_heads or llama.num_attention_heads),
                self.head.config.head_dim, target.runner.max_length + 2 * config.max_draft_len + 1, target.dtype, target.device,
            )

    def features(self, hidden_states: HiddenStates, rows: int | None = None) -> torch.Tensor:
        """The fused layers' states of the first ``rows`` positions: ``[rows, layers * hidden]``."""
        return torch.cat([hidden_states[i][:rows] for i in self.layers], dim=-1)

    def add_request(self, request: Request) -> None:
        request.method_state = HeadState(pending=[self.features(request.target_output.hidden_states)])

    def release(self) -> None:
        self.head = self.embed = self.draft_ids = self.static_cache = self.recorded = None
        super().release()

    def commit(self, request: Request, result: VerifyResult) -> None:
        """Queue the true features of the last token and the accepted drafts, unless queued already."""
        if request.finished or request.method_state.pairs == len(request.token_ids) - 1:
            return
        hidden_states = request.target_output.hidden_states
        if result.accepted_nodes is None:
            features = self.features(hidden_states, result.num_accepted + 1)
        else:
            # Tree rows are [root, node 0, node 1, ...]: take the root and the accepted path's nodes.
            rows = torch.tensor([0, *(1 + i for i in result.accepted_nodes)], device=self.device)
            features = self.features(hidden_states)[rows]
        request.method_state.pending.append(features)

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        """Draft within each request's budget of ``request.max_draft_len`` tokens: a tree for a
        greedy or seeded request when ``eagle_topk > 1``, else a chain (argmax, or sampled with its
        distributions). Chains are drafted for the whole batch at once, one head forward per depth."""
        proposals = [DraftProposal() for _ in requests]
        drafting = [b for b, request in enumerate(requests) if request.max_draft_len > 0]
        if not drafting:
            return proposals
        counts = self._pending_counts([requests[b] for b in drafting])
        if self._records_the_step([requests[b] for b in drafting]):
            for b, proposal in zip(drafting, self._recorded_step([requests[b] for b in drafting], counts)):
                proposals[b] = proposal
            return proposals
        hidden = self._catch_up([requests[b] for b in drafting], counts)
        chains = []
        for i, b in enumerate(drafting):
            request = requests[b]
            if self.config.is_tree and (request.params.greedy or request.noise is not None):
                depth = min(self.config.max_draft_len, request.max_draft_len)
                nodes = min(self.config.max_draft_tokens, request.max_draft_len)
                proposals[b] = self._tree(hidden[i : i + 1], request.method_state.cache, depth, nodes)
            else:
                chains.append(i)
        if chains:
            drafted = self._chains([requests[drafting[i]] for i in chains], hidden[chains])
            for i, proposal in zip(chains, drafted):
                proposals[drafting[i]] = proposal
        return proposals

    def _chains(self, requests: list[Request], hidden: torch.Tensor) -> list[DraftProposal]:
        """Each request's chain of ``min(max_draft_len, its budget)`` drafts, drafted together;
        ``hidden`` is ``[requests, 1, hidden]``, the head's outputs at their last true pairs."""
        lengths = [min(self.config.max_draft_len, r.max_draft_len) for r in requests]
        depth = max(lengths)
        caches = [r.method_state.cache for r in requests]
        greedy = all(r.params.greedy for r in requests)
        batch = RaggedDraftBatch([self._layer_caches(c) for c in caches], depth - 1, self.device)
        positions = torch.tensor([[c.length] for c in caches], device=self.device)
        # A batch of greedy requests keeps its picks on the device, each feeding the next depth,
        # and reads them once at the end: the host never waits for the device within the chain.
        picked: list[torch.Tensor] = []
        tokens: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        for step in range(depth):
            logits = self.head.logits(hidden)[:, -1]
            if greedy:
                ids = self.draft_ids[greedy_tokens(logits)]
                picked.append(ids)
            else:
                picks = self._choose(logits, requests, step)
                for b, (token, dist) in enumerate(picks):
                    if step < lengths[b]:
                        tokens[b].append(token)
                        if dist is not None:
                            probs[b].append(dist)
                ids = torch.tensor([token for token, _ in picks], device=self.device)
            if step + 1 < depth:
                mask = batch.extend(torch.ones(len(requests), 1, dtype=torch.bool))
                hidden = self.head(self.embed(ids[:, None]), hidden, positions + step, batch, mask)
        if greedy:
            tokens = [row[:n] for row, n in zip(torch.stack(picked, dim=1).tolist(), lengths)]
        return [DraftProposal(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]

    def _records_the_step(self, requests: list[Request]) -> bool:
        """Whether the step's catch-up and chains run as one recorded call: greedy chains where
        the target's forwards run in fixed shapes."""
        return self.recorded is not None and not self.config.is_tree and all(r.params.greedy for r in requests)

    def _recorded_step(self, requests: list[Request], counts: list[int]) -> list[DraftProposal]:
        """The batch's catch-up on its pending pairs and its greedy chains in one call of
        :meth:`_step_loop`, in the static cache's fixed shapes (recorded once per shape on CUDA
        and replayed); then the caught-up pairs go into each request's cache. A request further
        behind than a steady step leaves (``max_draft_len + 1`` pairs: just added, or drafting was
        paused for it) catches up alone first, timed as setup. The same drafts and head state as
        the eager catch-up and chains."""
        states: list[HeadState] = [r.method_state for r in requests]
        steady = self.config.max_draft_len + 1
        far = [count if count > steady else 0 for count in counts]
        catch_up(far, steady, lambda rows: self._forward_pending([requests[b] for b in rows], [far[b] for b in rows]),
                 self.setup_clock)
        counts = [0 if behind else count for behind, count in zip(far, counts)]
        lengths = [min(self.config.max_draft_len, r.max_draft_len) for r in requests]
        depth = max(lengths)
        cached = self.static_cache.load([self._layer_caches(state.cache) for state in states])
        rows, key_length = self.static_cache.shape_for(len(requests), max(cached) + steady + depth)
        features, token_ids = self._pending_inputs(requests, counts, rows, steady)
        starts = torch.tensor([[state.cached, count] for state, count in zip(states, counts)] + [[0, 0]] * (rows - len(requests)))
        # A request with no pairs pending (caught up above) drafts from the head's output it keeps.
        hidden = torch.zeros(rows, 1, self.head.config.hidden_size, dtype=features.dtype, device=self.device)
        for b, (state, count) in enumerate(zip(states, counts)):
            if not count:
                hidden[b] = state.last[0]

        def loop(features: torch.Tensor, token_ids: torch.Tensor, starts: torch.Tensor,
                 hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._step_loop(features, token_ids, starts, hidden, depth, key_length)

        picks, last = self.recorded((rows, depth, key_length), loop,
                                    [features, token_ids.to(self.device), starts.to(self.device), hidden])
        picks = picks[: len(requests)].tolist()
        for b, (state, count) in enumerate(zip(states, counts)):
            if count:
                for layer, keys, values in zip(self._layer_caches(state.cache), self.static_cache.keys, self.static_cache.values):
                    layer.append(keys[b : b + 1, :, state.cached : state.cached + count], values[b : b + 1, :, state.cached : state.cached + count])
                state.pending, state.cached, state.last = [], state.cached + count, last[b : b + 1].clone()
        return [DraftProposal(row[:n]) for row, n in zip(picks, lengths)]

    def _step_loop(self, features: torch.Tensor, token_ids: torch.Tensor, starts: torch.Tensor, hidden: torch.Tensor,
                   depth: int, key_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up over each row's pending pairs (``features``, ``token_ids``: ``[rows, width]``,
        the first ``starts[b, 1]`` of row ``b`` real, its cache holding ``starts[b, 0]`` positions),
        then :meth:`_chain_loop` from the last of them, or from ``hidden[b]`` for a row with none.
        Returns the ``[rows, depth]`` drafts and the head's outputs at the last pairs
        (``[rows, 1, hidden]``); nothing leaves the device."""
        cached, counts = starts[:, :1], starts[:, 1:]
        positions = cached + torch.arange(token_ids.shape[1], device=self.device)[None]
        self.static_cache.write_at(positions, key_length)
        mask = (torch.arange(key_length, device=self.device)[None, None] <= positions[..., None])[:, None]
        out = self.head(self.embed(token_ids), self.head.fuse(features), positions, self.static_cache, mask)
        last = out.gather(1, (counts - 1).clamp(min=0)[..., None].expand(-1, 1, out.shape[-1]))
        last = torch.where(counts[..., None] > 0, last, hidden)
        return self._chain_loop(last, cached + counts, depth, key_length), last

    def _chain_loop(self, hidden: torch.Tensor, starts: torch.Tensor, depth: int, key_length: int) -> torch.Tensor:
        """``[rows, depth]`` greedy drafts from the head's outputs ``hidden`` (``[rows, 1, hidden]``),
        row ``b``'s cache holding its first ``starts[b, 0]`` positions; nothing leaves the device."""
        keys = torch.arange(key_length, device=self.device)
        picks = []
        for step in range(depth):
            ids = self.draft_ids[greedy_tokens(self.head.logits(hidden)[:, -1])]
            picks.append(ids)
            if step + 1 < depth:
                positions = starts + step
                self.static_cache.write_at(positions, key_length)
                mask = (keys[None] <= positions)[:, None, None, :]
                hidden = self.head(self.embed(ids[:, None]), hidden, positions, self.static_cache, mask)
        return torch.stack(picks, dim=1)

    def _tree(self, hidden: torch.Tensor, cache: HeadCache, depth: int, num_nodes: int) -> DraftProposal:
        """EAGLE-2: expand the ``eagle_topk`` best nodes per depth, one head forward per depth, then
        keep the best ``num_nodes`` candidates. ``hidden`` is the head's output at the last true pair."""
        topk, device = self.config.eagle_topk, self.device
        committed = cache.length
        candidates = TreeCandidates(device)
        root = torch.full((1,), -1, dtype=torch.long, device=device)
        frontier, scores, tokens = candidates.add_children(
            root, torch.zeros(1, device=device), self._logprobs(hidden[0]), self.draft_ids, topk
        )
        inputs = hidden[0].expand(topk, -1)
        ancestors = torch.zeros(topk, 0, dtype=torch.bool, device=device)
        for level in range(1, depth):
            embeds = self.embed(tokens[None])
            positions = torch.full((1, topk), committed + level - 1, device=device)
            out = self.head(embeds, inputs[None], positions, cache, frontier_mask(committed, ancestors)[None, None])[0]
            children, child_scores, child_tokens = candidates.add_children(
                frontier, scores, self._logprobs(out), self.draft_ids, topk
            )
            scores, best = child_scores.topk(topk)
            frontier, tokens, parent_rows = children[best], child_tokens[best], best // topk
            inputs = out[parent_rows]
            seen = torch.cat((ancestors, torch.eye(topk, dtype=torch.bool, device=device)), dim=1)
            ancestors = seen[parent_rows]
        cache.crop(committed)
        token_ids, parents = candidates.best(num_nodes)
        return DraftProposal(token_ids, parents=parents)

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary log-probabilities for head output states ``[N, hidden]`` (float32)."""
        return F.log_softmax(self.head.logits(hidden).float(), dim=-1)

    def _pending_counts(self, requests: list[Request]) -> list[int]:
        """Each request's pending pairs, its cache cropped to its true pairs (a step that raised
        part-way may have left more)."""
        counts = []
        for request in requests:
            state: HeadState = request.method_state
            start, count = state.cached, state.pairs - state.cached
            if start + count != len(request.token_ids) - 1:
                raise RuntimeError(
                    f"EAGLE-3 head state out of step: {start} cached + {count} pending pairs for {len(request.token_ids)} tokens"
                )
            state.cache.crop(start)
            counts.append(count)
        return counts

    def _catch_up(self, requests: list[Request], counts: list[int]) -> torch.Tensor:
        """Run each request's ``counts`` pending true pairs through the head; returns its outputs at
        the last true pairs, ``[requests, 1, hidden]``. A request's state changes only once the
        head's forward over its pairs succeeded.

        Requests a step or two behind (a steady drafting step leaves at most ``max_draft_len + 1``
        pairs) catch up in one forward; one further behind (just added, or drafting was paused
        for it) catches up alone, timed as setup (:func:`specdec.catch_up`).
        """
        states: list[HeadState] = [r.method_state for r in requests]
        catch_up(counts, self.config.max_draft_len + 1,
                 lambda rows: self._forward_pending([requests[b] for b in rows], [counts[b] for b in rows]),
                 self.setup_clock)
        return torch.cat([state.last for state in states])

    def _forward_pending(self, requests: list[Request], counts: list[int]) -> list[torch.Tensor]:
        """One head forward over the pending pairs of ``requests`` (``counts[b]`` of them, each at
        least one), padded to the most; each request's cache takes its own. Returns each request's
        output at its last pair."""
        states: list[HeadState] = [r.method_state for r in requests]
        width = max(counts)
        features, token_ids = self._pending_inputs(requests, counts, len(requests), width)
        starts = torch.tensor([[state.cached] for state in states])
        positions = (starts + torch.arange(width)[None]).to(self.device)
        real = torch.arange(width)[None] < torch.tensor(counts)[:, None]
        batch = RaggedDraftBatch([self._layer_caches(state.cache) for state in states], width, self.device)
        mask = batch.extend(real)
        out = self.head(self.embed(token_ids.to(self.device)), self.head.fuse(features), positions, batch, mask)
        for b, (state, count) in enumerate(zip(states, counts)):
            for layer, (keys, values) in zip(self._layer_caches(state.cache), batch.appended(b, count)):
                layer.append(keys, values)
            state.pending, state.cached, state.last = [], state.cached + count, out[b : b + 1, count - 1 : count].clone()
        return [state.last for state in states]

    def _pending_inputs(self, requests: list[Request], counts: list[int], rows: int,
                        width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's inputs for the pending pairs of ``requests`` (``counts[b]`` of them, maybe
        none), padded to ``[rows, width]`` with zeros: the target features (on the device) and the pairs' tokens
        (on the host)."""
        features = torch.zeros(rows, width, self.head.fc.in_features, dtype=self.head.fc.weight.dtype, device=self.device)
        token_ids = torch.zeros(rows, width, dtype=torch.long)
        for b, (request, count) in enumerate(zip(requests, counts)):
            state: HeadState = request.method_state
            if not count:
                continue
            features[b, :count] = torch.cat(state.pending) if len(state.pending) > 1 else state.pending[0]
            token_ids[b, :count] = torch.tensor(request.token_ids[state.cached + 1 : state.cached + 1 + count])
        return features, token_ids

    def _layer_caches(self, cache: HeadCache) -> list[RequestKV]:
        return [cache.layer(i) for i in range(self.head.config.num_layers)]

    def _choose(
        self, draft_logits: torch.Tensor, requests: list[Request], offset: int
    ) -> list[tuple[int, torch.Tensor | None]]:
        """Per request, the target token for position ``len(request.token_ids) + offset`` from its
        row of draft-vocabulary logits ``[requests, draft_vocab]`` (:func:`specdec.draft_pick.pick_drafts`)."""
        return pick_drafts(draft_logits, requests, [offset] * len(requests), self.draft_ids, self.vocab_size)
