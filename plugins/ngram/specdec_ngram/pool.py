"""The n-gram pool: context n-grams mapped to where they occurred, updated incrementally.

A candidate is a position in a token sequence: the draft is the tokens that followed an earlier
occurrence of the current suffix, read from that sequence when drafting, so a candidate's
continuation grows as its sequence grows. Each step indexes only the positions added since the
last step (``len(new tokens) x number of n-gram sizes`` dictionary inserts), never the whole
context.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    _table: dict[tuple[int, ...], list[tuple[_Sequence, int]]] = field(default_factory=dict)
    _sequences: dict[int, _Sequence] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._table)

    def update(self, key: int, tokens: list[int]) -> None:
        """Index the positions of sequence ``key`` (``tokens``, kept by reference) not yet seen."""
        seq = self._sequences.get(key)
        if seq is None or seq.tokens is not tokens:
            seq = self._sequences[key] = _Sequence(tokens)
        # An n-gram enters the pool once a token follows it, so the current suffix never
        # matches itself.
        for end in range(max(seq.indexed, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._insert(tuple(tokens[end - n : end]), seq, end)
        seq.indexed = len(tokens)

    def forget(self, key: int) -> None:
        """Stop indexing sequence ``key``; candidates already in the pool stay."""
        self._sequences.pop(key, None)

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

    def _insert(self, ngram: tuple[int, ...], seq: _Sequence, end: int) -> None:
        candidates = self._table.get(ngram)
        if candidates is None:
            self._table[ngram] = [(seq, end)]
        elif self.keep_all:
            candidates.append((seq, end))
        else:
            # Keep one candidate: the largest, i.e. the one with the longest continuation. A newer
            # occurrence waits beside it until its continuation is as long, then replaces it.
            if len(candidates) == 2:
                candidates[:] = [self._largest(candidates)]
            candidates.append((seq, end))

    def _choose(self, candidates: list[tuple[_Sequence, int]]) -> tuple[_Sequence, int]:
        if not self.keep_all:
            return self._largest(candidates)
        return candidates[0] if self.use_oldest else candidates[-1]

    def _largest(self, candidates: list[tuple[_Sequence, int]]) -> tuple[_Sequence, int]:
        # Later entries win ties: among equally long continuations the newest is kept.
        return max(reversed(candidates), key=lambda c: min(len(c[0].tokens) - c[1], self.max_draft_len))
