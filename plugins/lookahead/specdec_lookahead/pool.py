"""The n-gram pool: for each key token, the most recent n-grams that followed it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class NGramPool:
    """Up to ``capacity`` continuations of ``n - 1`` tokens per key token, oldest evicted first.

    An n-gram seen again moves to the newest place, so the pool keeps what recurs. The lookahead
    window adds the n-grams its Jacobi iteration forms; the request's own tokens add theirs (its
    prompt when it starts, its output as it grows), as TensorRT-LLM's pool does.
    """

    def __init__(self, n: int, capacity: int) -> None:
        self.n = n
        self.capacity = capacity
        self._by_key: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, key: int, continuation: tuple[int, ...]) -> None:
        ngrams = self._by_key.setdefault(key, OrderedDict())
        ngrams[continuation] = None
        ngrams.move_to_end(continuation)
        if len(ngrams) > self.capacity:
            ngrams.popitem(last=False)

    def add_sequence(self, tokens: Sequence[int], start: int = 0) -> None:
        """The n-grams of ``tokens`` that end at position ``start`` or later."""
        for end in range(max(start, self.n - 1), len(tokens)):
            first = end - self.n + 1
            self.add(tokens[first], tuple(tokens[first + 1 : end + 1]))

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The continuations of ``key``, newest first."""
        return list(reversed(self._by_key.get(key, ())))
