"""What suffix decoding remembers: a tree per running request over its prompt and output, and a
global tree over the outputs of recent requests (SuffixDecoding's two trees, with vLLM's bounds).

A running request's output tokens enter both trees as they are generated; its prompt enters its
own tree only. When it finishes, its tree goes and its output stays in the global tree, queued
first in, first out: the oldest finished outputs leave once more than ``max_cached_requests`` are
kept, or more than ``max_cached_tokens`` tokens (0 requests: no global tree at all). Outputs of
running requests are never evicted.

A draft comes from whichever tree and match length promise the most accepted tokens (the sum of
the draft's estimated probabilities): a match of ``m`` tokens drafts at most
``max_spec_factor * m + max_spec_offset`` tokens, so a long match may draft long and a one-token
match little.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specdec.suffix.tree import Draft, SuffixTree


@dataclass(frozen=True)
class SuffixDefaults:
    """Suffix decoding's defaults (vLLM's, but for ``max_spec_offset``, arctic-inference's option),
    shared by the ``suffix`` method's config and the suffix drafts over other methods."""

    max_tree_depth: int = 24
    max_cached_requests: int = 10000
    max_cached_tokens: int = 200_000
    max_spec_factor: float = 1.0
    #: vLLM has no such option (0 in arctic-inference): 4 lets a fresh match, such as a reply
    #: returning to its prompt's text after an edit, draft a few tokens past its length.
    max_spec_offset: float = 4.0
    min_token_prob: float = 0.1


SUFFIX_DEFAULTS = SuffixDefaults()


@dataclass
class _Running:
    tree: SuffixTree
    #: The request's frontier in its own tree, and in the global tree (``None`` without one).
    local: list[int]
    shared: list[int] | None
    output: list[int] = field(default_factory=list)


class SuffixCache:
    def __init__(self, depth: int, max_cached_requests: int, max_cached_tokens: int) -> None:
        self.depth = depth
        self.max_cached_requests = max_cached_requests
        self.max_cached_tokens = max_cached_tokens
        self.global_tree = SuffixTree(depth) if max_cached_requests > 0 else None
        self._running: dict[int, _Running] = {}
        #: Finished outputs in the global tree, oldest first, and their tokens in all.
        self._cached: deque[list[int]] = deque()
        self.cached_tokens = 0

    @property
    def num_cached_requests(self) -> int:
        return len(self._cached)

    def __contains__(self, request_id: int) -> bool:
        """Whether ``request_id`` is running here (started and not yet stopped)."""
        return request_id in self._running

    def start(self, request_id: int, prompt: list[int]) -> None:
        tree = SuffixTree(self.depth)
        shared = self.global_tree.frontier() if self.global_tree is not None else None
        self._running[request_id] = _Running(tree, tree.extend(tree.frontier(), prompt), shared)

    def extend(self, request_id: int, token_ids: list[int], num_prompt_tokens: int) -> None:
        """Add the request's output tokens generated since the last call (``token_ids``: its
        prompt and output)."""
        state = self._running[request_id]
        new = token_ids[num_prompt_tokens + len(state.output) :]
        if not new:
            return
        state.local = state.tree.extend(state.local, new)
        if state.shared is not None:
            state.shared = self.global_tree.extend(state.shared, new)
        state.output.extend(new)

    def stop(self, request_id: int) -> None:
        """The request finished: its tree goes, its output stays cached in the global tree."""
        state = self._running.pop(request_id, None)
        if state is None or self.global_tree is None or not state.output:
            return
        self._cached.append(state.output)
        self.cached_tokens += len(state.output)
        while self._cached and (len(self._cached) > self.max_cached_requests or self.cached_tokens > self.max_cached_tokens):
            self._evict_oldest()

    def forget_finished(self) -> None:
        """Drop every finished request's output from the global tree."""
        while self._cached:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        oldest = self._cached.popleft()
        self.global_tree.remove(oldest)
        self.cached_tokens -= len(oldest)

    def speculate(self, request_id: int, context: list[int], max_tokens: int, max_spec_factor: float,
                  max_spec_offset: float, min_token_prob: float, tree: bool, min_match_len: int = 1) -> Draft:
        """The best draft after ``context`` (the request's tokens) over both trees and every match
        length from ``min_match_len`` up."""
        best = Draft()
        if max_tokens <= 0:
            return best
        state = self._running[request_id]
        # The request's own frontier already holds the nodes of its last tokens; the global
        # tree is searched for them.
        candidates = [(state.tree, state.local[1:])]
        if self.global_tree is not None:
            candidates.append((self.global_tree, self.global_tree.matches(context[-self.depth :])))
        for source, nodes in candidates:
            for length, node in enumerate(nodes[min_match_len - 1 :], min_match_len):
                budget = min(max_tokens, int(length * max_spec_factor + max_spec_offset + 1e-6))
                if budget <= 0 or not source.children(node):
                    continue
                draft = source.speculate(node, budget, min_token_prob, tree)
                if draft.score > best.score:
                    draft.match_len = length
                    best = draft
        return best
