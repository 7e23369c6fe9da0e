"""What a logits processor is, and the processors of one request applied in order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.logits_processing.rows import VerifyRows


class LogitsProcessor:
    """Changes the target's next-token logits of one request (one instance per request).

    Every row of a verify forward is processed as plain decoding would process the sequence it
    follows (:class:`VerifyRows`), so speculation keeps the processed output lossless: greedy
    picks the processed argmax, sampling draws from the processed distribution, and drafts are
    verified against that.

    Subclasses implement :meth:`apply`; a processor that forbids tokens outright (a grammar,
    ``min_tokens``) also implements :meth:`usable_drafts`, so a draft it would reject is cut
    before the target forward; a processor with state over the output implements :meth:`accept`.
    """

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        """Return the processed ``logits`` (``[len(rows), vocab]`` float32; may change them in place)."""
        raise NotImplementedError

    def usable_drafts(self, rows: VerifyRows) -> int:
        """How many of ``rows.drafts``, in layout order, come before the first draft this processor
        forbids outright (the drafts from that one on are cut; a tree stays a tree, as parents
        come first). Default: all."""
        return len(rows.drafts)

    def accept(self, tokens: Sequence[int]) -> None:
        """``tokens`` were appended to the request's output (in order)."""


class RequestProcessors:
    """One request's processors, applied in order (vLLM's: grammar, bad words, bias and
    ``min_tokens``, then penalties; a plugin's last)."""

    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = list(processors)

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        """The processed copy of ``logits`` (float32; the target's output is left as it is)."""
        out = logits.float().clone() if logits.dtype == torch.float32 else logits.float()
        for processor in self.processors:
            out = processor.apply(out, rows)
        return out

    def usable_drafts(self, rows: VerifyRows) -> int:
        return min((p.usable_drafts(rows) for p in self.processors), default=len(rows.drafts))

    def accept(self, tokens: Sequence[int]) -> None:
        for processor in self.processors:
            processor.accept(tokens)
