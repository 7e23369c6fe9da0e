"""The lookahead branch: one request's 2D window of guesses, laid out as a draft tree.

``rows[l][j]`` guesses the token ``1 + j + l`` places after the request's last token. Its
context in the forward is the last token, the first row up to column ``j``, then column ``j`` of
rows ``1 .. l``: each guess sees exactly its ancestors in a tree whose first row is a chain from
the root and whose columns hang below it. So the window is verified as any draft tree is (a guess
the target agrees with is accepted like a draft), and the target's pick after each guess of the
last row is one step of Jacobi iteration: the next row.

While the window fills, each step adds that next row. Once it holds ``n - 1`` rows, each column
with its next token is an n-gram (key: the first row's guess), which goes to the pool; the rows
move up one and the new row joins last. Whenever the request advances by more than one token,
the columns move left by the extra tokens and the freed places get filler tokens from the prompt.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from specdec import DraftTree
from specdec_lookahead.pool import NGramPool


class LookaheadWindow:
    """The window of one request.

    :param width: columns (``max_window_size``).
    :param ngram: n-gram size; the window fills up to ``ngram - 1`` rows.
    :param fillers: tokens to start the window from and fill freed places with (the prompt).
    :param seed: seeds the choice of fillers, so a request's drafts are the same on every run.
    """

    def __init__(self, width: int, ngram: int, fillers: Sequence[int], seed: int) -> None:
        self.width = width
        self.depth = ngram - 1
        self._fillers = list(fillers) or [0]
        self._random = random.Random(seed)
        self.rows: list[list[int]] = [self._filler_row(width)]

    @property
    def size(self) -> int:
        """Tree nodes the window needs this step."""
        return self.width * len(self.rows)

    def lay_out(self, tree: DraftTree) -> list[int]:
        """Add the window's guesses to ``tree`` (first row from the root, columns below it) and
        return the node of each column's last guess, whose target pick is the next row."""
        column_nodes = tree.add_chain(self.rows[0])
        for row in self.rows[1:]:
            column_nodes = [tree.add(parent, token) for parent, token in zip(column_nodes, row)]
        return column_nodes

    def advance(self, next_row: list[int] | None, tokens: int, pool: NGramPool) -> None:
        """The request advanced by ``tokens``; ``next_row`` holds the target's picks after the last
        row's guesses, or ``None`` when the window was not in this step's forward."""
        shift = tokens
        if next_row is not None:
            if len(self.rows) == self.depth:
                for column in range(self.width):
                    guesses = [row[column] for row in self.rows]
                    pool.add(guesses[0], (*guesses[1:], next_row[column]))
                self.rows = self.rows[1:]
                shift -= 1
            self.rows.append(next_row)
        if shift:
            keep = max(self.width - shift, 0)
            self.rows = [row[self.width - keep :] + self._filler_row(self.width - keep) for row in self.rows]

    def _filler_row(self, length: int) -> list[int]:
        return [self._random.choice(self._fillers) for _ in range(length)]
