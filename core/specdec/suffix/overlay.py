"""Suffix drafts over any method: TensorRT-LLM's ``use_sa_spec`` / ``sa_spec_threshold``.

A step's request whose last ``sa_spec_threshold`` or more tokens occurred before (in its own
prompt and output, or in a recent request's output) takes the chain that followed them instead
of its method's draft, and its method drafts nothing for it that step. A long match is where a
copy beats any model's guess (code edits, retries, quoted context), and the suffix draft costs
microseconds where a model's costs forwards. So a suffix draft may run longer than the method's
(``sa_spec_max_draft_len``, where TensorRT-LLM stops at ``max_draft_len``); the adaptive draft
length cuts it by the acceptance suffix drafts have had, apart from the method's. The drafts
come from the same trees and defaults as the ``suffix`` method, with a smaller global
tree. They are chains with no draft distribution: verification treats them as certain, so
sampled output stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.requests import DraftProposal, Request
from specdec.suffix.cache import SUFFIX_DEFAULTS, SuffixCache

#: The most output tokens of finished requests the global tree keeps: a tenth of the suffix
#: method's default, as suffix drafts are on by default for every model drafter. Each cached
#: token of chat answers holds about 3.5 KB of tree (200,000 tokens: 690 MB), so this bounds the
#: global tree near 70 MB while it still covers the last few dozen answers (retries, agent loops).
MAX_CACHED_TOKENS = SUFFIX_DEFAULTS.max_cached_tokens // 10


class SuffixDrafts:
    """The engine's suffix trees for ``use_sa_spec``: one per running request, plus the global one."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.cache = SuffixCache(SUFFIX_DEFAULTS.max_tree_depth, SUFFIX_DEFAULTS.max_cached_requests, MAX_CACHED_TOKENS)
        #: Suffix drafts verified instead of the method's so far.
        self.taken = 0

    def propose(self, batch: Sequence[Request], budgets: Sequence[int]) -> list[DraftProposal | None]:
        """Per request, the suffix chain of at most its budget when its match is long enough;
        ``None`` where its method drafts."""
        proposals: list[DraftProposal | None] = []
        for request, budget in zip(batch, budgets):
            proposals.append(self._propose(request, budget) if budget > 0 else None)
        return proposals

    def _propose(self, request: Request, budget: int) -> DraftProposal | None:
        rid, prompt_len = request.request_id, request.num_prompt_tokens
        if rid not in self.cache:
            self.cache.start(rid, request.token_ids[:prompt_len])
        self.cache.extend(rid, request.token_ids, prompt_len)
        d = SUFFIX_DEFAULTS
        draft = self.cache.speculate(rid, request.token_ids, budget, d.max_spec_factor, d.max_spec_offset,
                                     d.min_token_prob, tree=False, min_match_len=self.threshold)
        return DraftProposal(draft.token_ids) if draft.token_ids else None

    def stop(self, request: Request) -> None:
        """The request finished: its tree goes, its output joins the global tree."""
        self.cache.stop(request.request_id)
