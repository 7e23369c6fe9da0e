"""The n-gram pool: context n-grams mapped to where they occurred, updated incrementally.

A candidate is a position in a token sequence: the draft is the tokens that followed an earlier
occurrence of the current suffix, read from that sequence when drafting, so a candidate's
continuation grows as its sequence grows. Each step indexes only the positions added since the
last step (``len(new tokens) x number of n-gram sizes`` dictionary inserts), never the whole
context.

A shared pool outlives its requests: a finished (:meth:`NGramPool.forget`) sequence's n-grams
stay as candidates for later requests, but only the ``max_cached_sequences`` most recently
finished ones; older ones are evicted with every candidate that refers to them, so the pool's
memory is bounded by the running sequences plus that many finished ones. Running sequences are
never evicted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: One n-gram's candidates in insertion order, keyed by ``(id(sequence), end)`` so that evicting
#: a sequence removes each of its candidates in O(1), however many other sequences share the
#: n-gram (a list would be rewritten once per shared n-gram: quadratic in repeated prompts).
Candidates = dict[tuple[int, int], tuple["_Sequence", int]]


@dataclass
class _Sequence:
    tokens: list[int]
    indexed: int = 0


@dataclass
class NGramPool:
    min_n: int
    max_n: int
    keep_all: bool = True
    use_oldest: bool = True
    #: Continuations longer than this count as this long when candidates compete on size.
    max_draft_len: int = 4
    #: Finished sequences whose candidates stay after :meth:`forget`, oldest evicted first (None: all).
    max_cached_sequences: int | None = None
    _table: dict[tuple[int, ...], Candidates] = field(default_factory=dict)
    _sequences: dict[int, _Sequence] = field(default_factory=dict)
    _finished: deque[_Sequence] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self._table)

    @property
    def num_candidates(self) -> int:
        """Candidates over all n-grams (what the pool's memory grows with)."""
        return sum(map(len, self._table.values()))

    @property
    def num_sequences(self) -> int:
        """Sequences the pool holds candidates of: the running ones and the finished ones kept."""
        return len(self._sequences) + len(self._finished)

    def update(self, key: int, tokens: list[int]) -> None:
        """Index the positions of sequence ``key`` (``tokens``, kept by reference) not yet seen.

        ``tokens`` may only grow between calls: eviction finds a sequence's n-grams again by
        reading its indexed tokens.
        """
        seq = self._sequences.get(key)
        if seq is None or seq.tokens is not tokens:
            if seq is not None:
                self._finish(seq)
            seq = self._sequences[key] = _Sequence(tokens)
        # An n-gram enters the pool once a token follows it, so the current suffix never
        # matches itself.
        for end in range(max(seq.indexed, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._insert(tuple(tokens[end - n : end]), seq, end)
        seq.indexed = len(tokens)

    def forget(self, key: int) -> None:
        """Stop indexing sequence ``key``; its candidates stay until ``max_cached_sequences``
        later-finished sequences push them out."""
        seq = self._sequences.pop(key, None)
        if seq is not None:
            self._finish(seq)

    def forget_finished(self) -> None:
        """Drop the candidates of every forgotten sequence."""
        while self._finished:
            self._evict(self._finished.popleft())

    def propose(self, tokens: list[int], max_len: int) -> list[int]:
        """Draft up to ``max_len`` tokens continuing ``tokens``; the longest matching suffix wins."""
        if max_len <= 0:
            return []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            candidates = self._table.get(tuple(tokens[-n:]))
            if candidates:
                seq, start = self._choose(candidates)
                return seq.tokens[start : start + max_len]
        return []

    def _finish(self, seq: _Sequence) -> None:
        self._finished.append(seq)
        while self.max_cached_sequences is not None and len(self._finished) > self.max_cached_sequences:
            self._evict(self._finished.popleft())

    def _evict(self, seq: _Sequence) -> None:
        """Drop every candidate of ``seq``, visiting the n-grams it indexed (read from its tokens)."""
        tokens, key = seq.tokens, id(seq)
        for end in range(1, seq.indexed):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                ngram = tuple(tokens[end - n : end])
                candidates = self._table.get(ngram)
                if candidates is not None and candidates.pop((key, end), None) is not None and not candidates:
                    del self._table[ngram]

    def _insert(self, ngram: tuple[int, ...], seq: _Sequence, end: int) -> None:
        candidates = self._table.get(ngram)
        if candidates is None:
            candidates = self._table[ngram] = {}
        elif not self.keep_all and len(candidates) == 2:
            # Keep one candidate: the largest, i.e. the one with the longest continuation. A newer
            # occurrence waits beside it until its continuation is as long, then replaces it.
            largest = self._largest(candidates)
            candidates.clear()
            candidates[id(largest[0]), largest[1]] = largest
        candidates[id(seq), end] = (seq, end)

    def _choose(self, candidates: Candidates) -> tuple[_Sequence, int]:
        if not self.keep_all:
            return self._largest(candidates)
        return next(iter(candidates.values())) if self.use_oldest else next(reversed(candidates.values()))

    def _largest(self, candidates: Candidates) -> tuple[_Sequence, int]:
        # Later entries win ties: among equally long continuations the newest is kept.
        return max(reversed(candidates.values()), key=lambda c: min(len(c[0].tokens) - c[1], self.max_draft_len))
