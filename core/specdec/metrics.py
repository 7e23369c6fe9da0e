"""Speculation metrics with vLLM's names and definitions, per request and aggregated.

- acceptance rate = accepted tokens / draft tokens
- mean acceptance length = 1 + accepted tokens / drafts (tokens gained per drafting step)
- per-position acceptance rate = accepted at position i / drafts (for a tree, at depth i: one
  entry per level the deepest proposal reached, not per node)
- lossy-accepted tokens: accepted tokens that only an acceptance rule which is not lossless kept
  (:attr:`specdec.VerifyResult.num_lossy_accepted`); included in the accepted tokens, and 0 for a
  lossless method

As in vLLM, a draft counts as accepted when verification keeps it, even if a stop condition
then ends the output before it.

Decode time is split into drafting, the target forward and the rest (``time_overhead``:
verification, KV rollback, stop checks, hook dispatch), so the engine's own cost is visible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class RequestMetrics:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_lossy_accepted_tokens: int = 0
    num_output_tokens: int = 0
    #: Prompt tokens whose prefill came from the prefix cache (vLLM's ``num_cached_tokens``).
    num_cached_tokens: int = 0
    num_steps: int = 0
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_forward: float = 0.0
    time_verify: float = 0.0
    time_decode: float = 0.0
    #: Logits processing (grammar masks, penalties, ...), within the times above.
    time_logits_processing: float = 0.0

    def record_step(self, num_draft_tokens: int, num_accepted: int, depth: int, num_lossy_accepted: int = 0) -> None:
        """Count one decoding step that proposed ``num_draft_tokens`` tokens reaching ``depth``
        positions deep (a chain's length, a tree's deepest path) and accepted ``num_accepted`` of
        them, ``num_lossy_accepted`` of those by a rule that is not lossless."""
        self.num_steps += 1
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.num_lossy_accepted_tokens += num_lossy_accepted
        per_pos = self.num_accepted_tokens_per_pos
        per_pos.extend([0] * (depth - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos] if self.num_drafts else []

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_decode

    @property
    def time_overhead(self) -> float:
        """Decode time spent outside drafting and the target forward (verification included)."""
        return max(self.time_decode - self.time_draft - self.time_forward, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return self.num_output_tokens / self.time_total if self.time_total else 0.0

    @property
    def time_per_output_token(self) -> float:
        return self.time_total / self.num_output_tokens if self.num_output_tokens else 0.0

    # TensorRT-LLM's per-request names.
    @property
    def total_draft_tokens(self) -> int:
        return self.num_draft_tokens

    @property
    def total_accepted_draft_tokens(self) -> int:
        return self.num_accepted_tokens

    def merge(self, other: RequestMetrics) -> None:
        """Add ``other``'s counts and times into this one."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["num_accepted_tokens_per_pos"] = list(self.num_accepted_tokens_per_pos)
        for name in (
            "acceptance_rate",
            "mean_acceptance_length",
            "acceptance_rate_per_pos",
            "time_total",
            "time_overhead",
            "tokens_per_second",
            "time_per_output_token",
        ):
            out[name] = getattr(self, name)
        return out


def aggregate(metrics: Iterable[RequestMetrics]) -> RequestMetrics:
    """Sum per-request metrics into one (rates are recomputed from the summed counts)."""
    total = RequestMetrics()
    for m in metrics:
        total.merge(m)
    return total


def format_rates_per_pos(rates: list[float], shown: int = 5) -> str:
    """The first ``shown`` per-position acceptance rates, zeros included, for a table cell; ``..``
    when a later position accepted too."""
    if not rates:
        return "-"
    return " ".join(f"{r:.2f}" for r in rates[:shown]) + (" .." if any(rates[shown:]) else "")
