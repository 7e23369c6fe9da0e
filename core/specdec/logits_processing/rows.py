"""The rows of one request's verify forward, each with the draft tokens that lead to it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from specdec.requests import DraftProposal, Request


@dataclass(frozen=True)
class VerifyRows:
    """Row 0 of a request's verify forward follows its committed tokens (``request.token_ids``);
    row ``1 + i`` follows draft node ``i`` of its proposal (a chain or a tree).

    A logits processor treats each row as plain decoding would treat the sequence that row
    follows: ``request.token_ids + paths[row]``. That is what keeps processed speculative output
    equal to processed plain output.
    """

    request: Request
    drafts: tuple[int, ...] = ()
    #: ``parents[i]``: draft node ``i``'s parent node, ``-1`` for a child of the committed tokens.
    parents: tuple[int, ...] = ()

    @classmethod
    def of(cls, request: Request, proposal: DraftProposal | None = None) -> VerifyRows:
        if proposal is None or not len(proposal):
            return cls(request)
        parents = proposal.parents if proposal.parents is not None else range(-1, len(proposal) - 1)
        return cls(request, tuple(proposal.token_ids), tuple(parents))

    def __len__(self) -> int:
        return len(self.drafts) + 1

    @cached_property
    def paths(self) -> list[tuple[int, ...]]:
        """Per row, the draft tokens between the committed tokens and that row (row 0: none)."""
        paths: list[tuple[int, ...]] = [()]
        for token, parent in zip(self.drafts, self.parents):
            paths.append(paths[parent + 1] + (token,))
        return paths

    def row_parent(self, row: int) -> int:
        """The row whose logits chose row ``row``'s draft token (``row >= 1``)."""
        return self.parents[row - 1] + 1
