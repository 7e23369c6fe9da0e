"""The draft model: one batched KV cache for the running requests, a chain of drafts per step.

Each running request has a row in the draft's :class:`~specdec.kv_cache.BatchKVCache`. A row
holds a prefix of the request's tokens (``committed``) followed by the drafts fed back into it
while drafting (``pending``). Each step first reconciles the rows with the engine's batch (rows of
finished requests leave, rows follow the batch's order, and a request drafted for the first time
gets its row: its tokens so far are prefilled alone, then the row takes the place of a finished
request's or joins at the end), keeps the pending
drafts the request really emitted and drops the rest, then drafts for every request at once:

- one batched forward feeds each row the token the target emitted since it last drafted (the
  bonus or corrected token); rows further behind, after steps without drafting, are first fed
  the rest of their tail in one batched forward of its own;
- ``k - 1`` batched one-token forwards extend every row's chain (the last draft is never fed:
  nothing needs its logits), ``k`` being the longest budget; rows with shorter budgets are
  padded and rolled back.

A PARD draft (``mask_token`` given: AMD's parallel drafts, vLLM's ``parallel_drafting``) drafts
the ``k`` tokens in that one forward instead: each row is fed its new tokens followed by
``k - 1`` mask tokens, and the logits at the last new token and at the masks give drafts 1 to
``k``, each from the row's real tokens alone. The masks' cache entries are rolled back at once,
so a row only ever holds real tokens, and the next step feeds it the tokens the target emitted.
Draft ``i`` is chosen from its own distribution, which does not depend on drafts before it,
so sampled drafts are verified exactly as a chain's are.

With a draft vocabulary (``draft_vocab_size``), the draft's output layer covers only the kept
tokens: choices are made over them and mapped back to target ids, and sampled drafts report
their probabilities over the target's vocabulary, zero for every token not kept.

With a confidence threshold, a row's chain ends after a draft token the draft gave less than
that probability (the token is still proposed: the target may well agree), and drafting stops
as soon as every row's chain has ended, saving the forwards a weak draft would waste. Whether to
go on depends only on tokens already drafted, so sampled output keeps the target's distribution.

Reconciling from ``request.token_ids`` at each step makes the state right whatever happened in
between, including steps the engine ran without drafting and a drafting call that raised part-way
(rows are first cut back to the tokens their state records).

The prefill waits for the first step that drafts: a request the engine's policy never drafts for
(in a large batch where drafting does not pay) never costs the draft a forward. The prefill
and the catch-up are timed apart, on ``setup_clock``, so the engine does not mistake them for
the per-token cost of drafting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specdec import BatchKVCache, DraftProposal, ModelRunner, Request, SetupClock, pick_drafts, trim_output_layer


@dataclass
class DraftState:
    """One request's place in the draft cache."""

    #: Token ids in the request's cache row, in order.
    tokens: list[int] = field(default_factory=list)
    #: How many leading ``tokens`` are known to equal the request's own tokens.
    committed: int = 0


class DraftModel:
    """A causal LM sharing the target's tokenizer, used as a drafter for a batch of requests."""

    def __init__(self, model: PreTrainedModel, target_vocab_size: int, confidence_threshold: float = 0.0,
                 vocab: torch.Tensor | None = None, execution: str = "eager", max_rows: int = 1,
                 max_model_len: int | None = None, mask_token: int | None = None, max_draft_len: int = 1) -> None:
        """``vocab``, when given, holds the only token ids the draft may propose (in id order):
        the output layer keeps only their rows (:mod:`specdec.draft_vocab`).
        ``mask_token``, when given, drafts every token of a step in one forward (a PARD draft's
        ``pard_token``); ``max_draft_len`` then sizes that forward.
        ``execution``, ``max_rows`` and ``max_model_len`` size and run the draft's batch cache
        as the target's (:class:`~specdec.runner.ModelRunner`): with CUDA graphs, a drafting
        step's forwards are captured for every batch size up to ``max_rows``."""
        if vocab is not None:
            trim_output_layer(model, vocab)
        self.runner = ModelRunner(model, execution=execution, max_model_len=max_model_len)
        self.mask_token = mask_token
        # A parallel step feeds the accepted drafts, the target's token and k - 1 masks.
        self.runner.prepare(max_rows, 2 * max_draft_len if mask_token is not None else 1)
        self.target_vocab_size = target_vocab_size
        self.vocab = vocab.to(self.runner.device) if vocab is not None else None
        self.confidence_threshold = confidence_threshold
        self.cache = self.runner.new_batch_cache()
        #: Request ids of the cache's rows, in row order.
        self.rows: list[int] = []
        #: Times bringing rows up to date: prefilling a request's row, and feeding it the tokens
        #: emitted while drafting was paused for it.
        self.setup_clock = SetupClock()
        #: Requests added and not yet freed.
        self._live: set[int] = set()

    def add(self, request: Request) -> DraftState:
        """The request's state; its row is prefilled at the first step that drafts for it."""
        self._live.add(request.request_id)
        return DraftState()

    def free(self, request: Request) -> None:
        """A request has ended. Its row leaves at the next step's sync (one copy of the cache for
        every request that left since); once no request is left, the cache goes at once, so a
        finished ``generate`` holds no draft KV memory (but for a static cache's buffers, which
        its captured forwards write to)."""
        self._live.discard(request.request_id)
        if not self._live:
            self.release()

    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        """Draft up to ``request.max_draft_len`` tokens after each request's ``token_ids``."""
        states: list[DraftState] = [r.method_state for r in requests]
        self._sync_rows(requests, states)
        self._drop_unrecorded(states)
        self._keep_confirmed(requests, states)
        budgets = [max(min(r.max_draft_len, self.runner.max_length - len(r.token_ids)), 0) for r in requests]
        rounds = max(budgets, default=0)
        if rounds == 0:
            return [DraftProposal() for _ in requests]
        feed, refed = [], []
        for request, state in zip(requests, states):
            new = request.token_ids[state.committed :]
            refed.append(int(not new))
            if not new:  # the row already holds every token: re-feed the last one for its logits
                state.tokens.pop()
                new = request.token_ids[-1:]
            feed.append(new)
        if any(refed):
            self.cache.rollback_rows(refed)
        # Rows further behind than a steady step feeds (drafting was paused for them) catch up
        # first, timed apart: a steady chain step feeds each row one token, a parallel one the
        # accepted drafts and the target's token.
        steady = 1 if self.mask_token is None else rounds + 1
        if max(len(new) for new in feed) > steady:
            with self.setup_clock.timing():
                self.runner.forward_rows(self.cache, [new[:-steady] for new in feed])
        for state, new in zip(states, feed):
            state.tokens.extend(new)
            state.committed = len(state.tokens)
        feed = [new[-steady:] for new in feed]
        if self.mask_token is None:
            drafts, probs = self._draft_chains(requests, states, feed, budgets)
        else:
            drafts, probs = self._draft_parallel(requests, feed, budgets)
        return [DraftProposal(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]

    def _draft_chains(self, requests: list[Request], states: list[DraftState], feed: list[list[int]],
                      budgets: list[int]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Each row's drafts one forward at a time; the fed drafts stay pending in the rows."""
        outputs = self.runner.forward_rows(self.cache, [new[-1:] for new in feed])
        logits = [out.logits[-1] for out in outputs]
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        fed = 0  # chain forwards run: each appended one token to every row
        for step in range(max(budgets)):
            live = [b for b in range(len(requests)) if step < budgets[b]]
            picks = self._pick([requests[b] for b in live], [logits[b] for b in live], [step] * len(live))
            for b, (token, dist, ends) in zip(live, picks):
                drafts[b].append(token)
                if dist is not None:
                    probs[b].append(dist)
                if ends:
                    budgets[b] = step + 1
            if step + 1 >= max(budgets):
                break
            # Rows whose budget is spent are fed a placeholder, rolled back below.
            tokens = [d[step] if step < len(d) else 0 for d in drafts]
            outputs = self.runner.forward_rows(self.cache, [[t] for t in tokens])
            fed += 1
            logits = [out.logits[-1] for out in outputs]
            for b, state in enumerate(states):
                if step < budgets[b] - 1:
                    state.tokens.append(tokens[b])
        self.cache.rollback_rows([fed - max(len(d) - 1, 0) for d in drafts])
        return drafts, probs

    def _draft_parallel(self, requests: list[Request], feed: list[list[int]],
                        budgets: list[int]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """Every row's drafts from one forward of its new tokens and ``budget - 1`` mask tokens."""
        masks = [max(k - 1, 0) for k in budgets]
        outputs = self.runner.forward_rows(self.cache, [new + [self.mask_token] * m for new, m in zip(feed, masks)])
        self.cache.rollback_rows(masks)
        owners = [b for b, k in enumerate(budgets) for _ in range(k)]
        offsets = [i for k in budgets for i in range(k)]
        rows = [outputs[b].logits[len(outputs[b].logits) - budgets[b] + i] for b, i in zip(owners, offsets)]
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        ended: set[int] = set()
        for b, (token, dist, ends) in zip(owners, self._pick([requests[b] for b in owners], rows, offsets)):
            if b in ended:
                continue
            drafts[b].append(token)
            if dist is not None:
                probs[b].append(dist)
            if ends:
                ended.add(b)
        return drafts, probs

    def _pick(self, requests: list[Request], logits: list[torch.Tensor],
              offsets: list[int]) -> list[tuple[int, torch.Tensor | None, bool]]:
        """Per row of ``logits``: its request's draft (a target id; :func:`specdec.pick_drafts`),
        the distribution it was sampled from (``None`` for greedy), and whether the request's
        chain ends there (the draft gave it less than the confidence threshold)."""
        if not logits:
            return []
        rows = torch.stack([self._draft_logits(row) for row in logits])
        picks = pick_drafts(rows, requests, offsets, self.vocab, self.target_vocab_size)
        if not self.confidence_threshold:
            return [(token, dist, False) for token, dist in picks]
        confidence = torch.softmax(rows.float(), -1).amax(-1).tolist()
        return [(token, dist, (c if dist is None else float(dist[token])) < self.confidence_threshold)
                for (token, dist), c in zip(picks, confidence)]

    def release(self) -> None:
        self.cache = self.runner.new_batch_cache()
        self.rows = []

    def _sync_rows(self, requests: list[Request], states: list[DraftState]) -> None:
        """Make the cache's rows the batch's requests, in the batch's order."""
        wanted = [r.request_id for r in requests]
        if self.rows == wanted:
            return
        # A newcomer in the place of a request that left (the engine refills a batch this way)
        # takes that row in place; only what is left over costs a copy of the whole cache.
        staying = set(wanted)
        for row, (request, state) in enumerate(zip(requests, states)):
            if row < len(self.rows) and self.rows[row] not in staying and request.request_id not in self.rows:
                self.cache.replace_row(row, self._prefill(request, state))
                self.rows[row] = request.request_id
        if self.rows == wanted:
            return
        present = {rid: i for i, rid in enumerate(self.rows)}
        keep = [present[rid] for rid in wanted if rid in present]
        if keep != list(range(len(self.rows))):
            self.cache.select_rows(keep)
            self.rows = [self.rows[i] for i in keep]
        joining = [(request, state) for request, state in zip(requests, states) if request.request_id not in present]
        if joining:
            self.cache.append_rows(*(self._prefill(request, state) for request, state in joining))
            self.rows.extend(request.request_id for request, _ in joining)
        if self.rows != wanted:
            position = {rid: i for i, rid in enumerate(self.rows)}
            self.cache.select_rows([position[rid] for rid in wanted])
            self.rows = wanted

    def _prefill(self, request: Request, state: DraftState) -> BatchKVCache:
        """A row holding the request's tokens but the last, forwarded alone (a batched forward
        would pad every other row to this one's length); the step's first forward feeds the last."""
        with self.setup_clock.timing():
            cache = self.runner.new_cache()
            prefix = request.token_ids[:-1]
            if prefix:
                self.runner.forward(cache, prefix, last_only=True)
        state.tokens, state.committed = list(prefix), len(prefix)
        return cache

    def _drop_unrecorded(self, states: list[DraftState]) -> None:
        """Cut each row and its state back to the tokens both hold.

        They agree whenever a call returned. One that raised part-way (the engine then retries
        each request alone) may have forwarded tokens its rows' state does not record yet, or
        dropped from the state a token it was about to feed again; the tokens both hold are still
        the row's, so drafting goes on from them as if that call had never run.
        """
        lengths = self.cache.lengths
        for state, length in zip(states, lengths):
            del state.tokens[length:]
            state.committed = min(state.committed, len(state.tokens))
        self.cache.rollback_rows([length - len(state.tokens) for state, length in zip(states, lengths)])

    def _keep_confirmed(self, requests: list[Request], states: list[DraftState]) -> None:
        """Keep each row's pending drafts that its request emitted; drop the others."""
        drop = []
        for request, state in zip(requests, states):
            pending = state.tokens[state.committed :]
            actual = request.token_ids[state.committed : state.committed + len(pending)]
            kept = 0
            while kept < len(actual) and pending[kept] == actual[kept]:
                kept += 1
            drop.append(len(pending) - kept)
            del state.tokens[state.committed + kept :]
            state.committed += kept
        self.cache.rollback_rows(drop)

    def _draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over what the draft may propose: the target's vocabulary, or the kept tokens.

        Same tokenizer, but embedding matrices are often padded to different sizes: rows past
        the tokenizer are never real tokens, so they are cut or padded with -inf.
        """
        n = self.target_vocab_size
        if self.vocab is not None:
            return logits
        if logits.shape[-1] >= n:
            return logits[:n]
        return torch.nn.functional.pad(logits, (0, n - logits.shape[-1]), value=float("-inf"))
