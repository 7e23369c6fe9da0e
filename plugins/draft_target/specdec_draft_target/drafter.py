"""The draft model: its own KV cache per request, a chain of drafts per step, rolled back after.

Per request the draft cache holds a prefix of the request's tokens (``committed``) followed by
the drafts fed back into it while drafting (``pending``). Drafting first feeds the tokens the
target emitted since the last step (catch-up), then drafts ``k`` tokens with ``k - 1`` more
one-token forwards (the last draft is never fed: nothing needs its logits). After verification
:meth:`DraftModel.accept` keeps the pending drafts the request actually kept and crops the rest.

All per-request state lives in ``request.method_state`` (a :class:`DraftState`), so a batched
draft forward can replace the per-request loop without changing what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from specdec import DraftProposal, Request, logits_to_probs
from specdec.runner import ModelRunner
from specdec.sampling import sample


@dataclass
class DraftState:
    cache: DynamicCache
    #: Token ids in ``cache``, in order.
    tokens: list[int] = field(default_factory=list)
    #: How many leading ``tokens`` are known to equal the request's own tokens.
    committed: int = 0


class DraftModel:
    """A causal LM sharing the target's tokenizer, used as a drafter."""

    def __init__(self, model: PreTrainedModel, target_vocab_size: int) -> None:
        self.runner = ModelRunner(model)
        self.target_vocab_size = target_vocab_size

    def new_state(self) -> DraftState:
        return DraftState(self.runner.new_cache())

    def propose(self, request: Request, state: DraftState) -> DraftProposal:
        """Draft up to ``request.max_draft_len`` tokens after ``request.token_ids``."""
        self.accept(request, state)
        k = min(request.max_draft_len, self.runner.max_length - len(request.token_ids))
        if k <= 0:
            return DraftProposal()
        new = request.token_ids[state.committed :]
        if not new:  # the cache already holds every token: re-feed the last one for its logits
            self.runner.rollback(state.cache, 1)
            state.tokens.pop()
            new = request.token_ids[-1:]
        logits = self._feed(state, new)
        state.committed = len(state.tokens)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if request.params.greedy:
                token = int(logits.argmax())
            else:
                q = logits_to_probs(logits, request.params)
                token = sample(q, request.generator)
                probs.append(q)
            tokens.append(token)
            if i < k - 1:
                logits = self._feed(state, [token])
        return DraftProposal(tokens, torch.stack(probs) if probs else None)

    def accept(self, request: Request, state: DraftState) -> None:
        """Keep the pending drafts that ``request.token_ids`` confirms; crop the others."""
        pending = state.tokens[state.committed :]
        actual = request.token_ids[state.committed : state.committed + len(pending)]
        kept = 0
        while kept < len(actual) and pending[kept] == actual[kept]:
            kept += 1
        self.runner.rollback(state.cache, len(pending) - kept)
        del state.tokens[state.committed + kept :]
        state.committed += kept

    def _feed(self, state: DraftState, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` to the draft cache; the logits after the last, on the target's vocabulary."""
        logits = self.runner.forward(state.cache, token_ids, last_only=True).logits[-1]
        state.tokens.extend(token_ids)
        return self._on_target_vocab(logits)

    def _on_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        # Same tokenizer, but embedding matrices are often padded to different sizes: rows past
        # the tokenizer are never real tokens, so they are cut or padded with -inf.
        n = self.target_vocab_size
        if logits.shape[-1] >= n:
            return logits[:n]
        return torch.nn.functional.pad(logits, (0, n - logits.shape[-1]), value=float("-inf"))
