"""The state of one generation request and the values that pass between hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.draft_policy import AcceptanceEstimate
from specdec.logprobs import TokenLogprob
from specdec.metrics import RequestMetrics
from specdec.sampling import PositionNoise, SamplingParams, race


@dataclass
class Request:
    """One running generation.

    ``token_ids`` is the prompt followed by every token generated so far; its last token is the
    one the target forwards next (it is not yet in the target's KV cache).
    """

    request_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    #: The noise each position's token is drawn with, for a sampled request with a seed.
    noise: PositionNoise | None = None
    #: Draft budget for the current step, set by the engine before drafting.
    max_draft_len: int = 0
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    #: Running per-position acceptance of this request's drafts (drives adaptive draft length).
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    #: The same for the suffix drafts it took instead of its method's (``use_sa_spec``).
    suffix_acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    finished: bool = False
    #: ``stop``, ``length``, ``abort`` (the caller aborted it) or ``error`` (see ``error``).
    finish_reason: str | None = None
    #: Why the request failed (``finish_reason == "error"``); the requests beside it go on.
    error: str | None = None
    #: Free slot for a method's per-request state (the engine never touches it).
    method_state: Any = None
    #: The target's output of this step's forward (logits, and hidden states when the runner
    #: captures them), for methods that draft from target features. Cleared when the request ends.
    target_output: Any = None
    #: Output tokens already reported in a :class:`RequestDelta`.
    num_reported: int = 0
    #: Streams the output's text (set by the engine when the request is added).
    detokenizer: Any = None
    #: Each output token's log-probability, when ``params.logprobs`` asks for them.
    logprobs: list[TokenLogprob] | None = None
    #: The logits processors ``params`` ask for (:mod:`specdec.logits_processing`), or ``None``.
    processors: Any = None

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def sample(self, probs: torch.Tensor, offset: int = 0) -> int:
        """Draw the token for sequence position ``len(token_ids) + offset`` from ``probs``
        (``[vocab]``, over the target's vocabulary).

        With a seed, the draw is that position's noise (:class:`~specdec.sampling.PositionNoise`),
        the noise the target's own pick at that position uses: a draft drawn this way is the
        token the target picks whenever both distributions allow it. Without, torch's generator.
        """
        if self.noise is not None:
            return int(race(probs, self.noise.at(len(self.token_ids) + offset)))
        return int(torch.multinomial(probs, 1).item())


@dataclass
class RequestDelta:
    """What one engine step did for one request (:meth:`specdec.engine.Engine.step`)."""

    request_id: int
    new_token_ids: list[int]
    #: New text, decoded incrementally: a stop string is never sent, and text that could begin
    #: one is held back until it cannot.
    text_delta: str
    finished: bool
    finish_reason: str | None
    error: str | None
    num_prompt_tokens: int
    #: A snapshot of the request's metrics so far.
    metrics: RequestMetrics
    #: The new tokens' log-probabilities, when the request asks for them.
    logprobs: list[TokenLogprob] | None = None


@dataclass
class DraftProposal:
    """Draft tokens for one request, verified in one target forward: a chain or a tree.

    ``probs`` is the draft distribution each token was sampled from (``[len(token_ids), vocab]``,
    shaped by :func:`specdec.sampling.logits_to_probs`); ``None`` means a deterministic draft
    (n-gram, one-hot q), which rejection sampling handles exactly.

    ``parents`` makes the proposal a tree: ``token_ids`` are its nodes laid out flat and
    ``parents[i]`` is node ``i``'s parent index, ``-1`` for a child of the request's last token;
    a parent comes before its child. ``None`` is a chain.
    """

    token_ids: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None
    parents: list[int] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncated(self, length: int) -> DraftProposal:
        """The first ``length`` drafts (for a tree: its first nodes, still a tree, as parents come first)."""
        if len(self) <= length:
            return self
        probs = self.probs[:length] if self.probs is not None else None
        parents = self.parents[:length] if self.parents is not None else None
        return DraftProposal(self.token_ids[:length], probs, parents)


@dataclass
class VerifyResult:
    """What verification decided for one request: the drafts kept and the token after them.

    For a tree proposal, ``accepted_nodes`` lists the kept path's node indices from the root
    down (``num_accepted`` of them).

    ``num_lossy_accepted`` counts the kept drafts that only a rule which is not lossless kept
    (Medusa's typical acceptance, MTP's relaxed acceptance): the core's lossless verification
    would have rejected them. The metrics report it apart, as such output no longer follows the
    target's.
    """

    num_accepted: int
    next_token: int
    accepted_nodes: list[int] | None = None
    num_lossy_accepted: int = 0

    def path(self) -> list[int]:
        """Indices into the proposal's ``token_ids`` of the kept drafts, in order."""
        return self.accepted_nodes if self.accepted_nodes is not None else list(range(self.num_accepted))

    def emitted(self, proposal: DraftProposal) -> list[int]:
        """The tokens this step adds: accepted drafts, then the bonus or recovered token."""
        return [proposal.token_ids[i] for i in self.path()] + [self.next_token]

    def emitted_rows(self) -> list[int]:
        """Row by row with :meth:`emitted`, the verify forward's logits row each token was chosen
        from: its predecessor's (row 0 the request's last token, row ``1 + i`` draft ``i``)."""
        return [0, *(1 + i for i in self.path())]
