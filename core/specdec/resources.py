"""Per-session method state and what a method may know about the target model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specdec.setup_time import SetupClock

if TYPE_CHECKING:
    from specdec.requests import Request, VerifyResult
    from specdec.runner import ModelRunner


@dataclass
class TargetContext:
    """The target model as a method sees it when building its resources."""

    runner: ModelRunner
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    #: The most requests the engine decodes together: a drafter keeping a batch cache of its own
    #: sizes it so (a static one, ``runner.execution`` not ``eager``, holds that many rows for good).
    max_batch_size: int = 1

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size


class ResourceManager:
    """Per-session state of a method. Subclass it; every method here is optional.

    The engine calls ``add_request`` after a request's prefill (``request.token_ids`` holds the
    prompt and the first generated token; the request may already be finished), ``free_request``
    when it finishes, and ``release`` once when the
    ``LLM`` closes. After ``release`` the manager holds no tensors or models.
    """

    #: Whether a drafting step costs about the same per drafted token (a chain drafted one
    #: forward per token: the default), or the same whatever the number of drafts (``False``: a
    #: drafter that proposes every token of a step in one forward, as parallel drafting does).
    #: The engine's adaptive policy weighs each draft length by it.
    draft_cost_per_token: bool = True

    def __init__(self) -> None:
        self.released = False
        #: Times the setup a drafting call does (:meth:`setup_seconds`, :func:`~specdec.setup_time.catch_up`).
        self.setup_clock = SetupClock()

    def add_request(self, request: Request) -> None:
        """Set up per-request state."""

    def free_request(self, request: Request) -> None:
        """Drop per-request state."""

    def release(self) -> None:
        """Free everything this manager holds. Subclasses call ``super().release()``."""
        self.released = True

    def forget_finished(self) -> None:
        """Forget what is kept of finished requests (suffix decoding's global tree, a public
        n-gram pool), as if none had run; running requests keep theirs. A benchmark calls it
        before it sends a prompt again, so the repeat is not drafted from its own earlier answer."""

    def setup_seconds(self) -> float:
        """Seconds spent so far, inside drafting calls, on work a steady drafting step does not do.

        A method that defers per-request setup to the first step that drafts for the request (a
        draft model prefilling its prompt only when it is needed), or that catches its state up on
        tokens emitted while drafting was paused, reports that time here. The engine reads it
        around each drafting call and keeps it out of the per-token drafting cost its adaptive
        policy weighs, charging a resume's setup to the decision to resume instead
        (:class:`~specdec.draft_policy.ResumeCost`); the time still counts in the request's metrics.
        Time it with :attr:`setup_clock`.
        """
        return self.setup_clock.seconds


class HiddenStateResources(ResourceManager):
    """Resources of a method that drafts from the target's hidden states (EAGLE-3, Medusa, MTP):
    the runner keeps the hidden states ``layers`` (indices into ``hidden_states``, ``-1`` the final
    normed state; :class:`~specdec.hidden_states.HiddenStates`) of every forward, in
    ``request.target_output.hidden_states``, from construction until ``release``, and a request's
    ``method_state`` is dropped when it finishes. Only the states listed are kept: the captured
    forwards copy each one out per step."""

    def __init__(self, target: TargetContext, layers: Sequence[int] = (-1,)) -> None:
        super().__init__()
        self.runner: ModelRunner | None = target.runner
        self.runner.hidden_layers = layers

    def free_request(self, request: Request) -> None:
        request.method_state = None

    @staticmethod
    def last_state(request: Request, result: VerifyResult | None = None) -> torch.Tensor:
        """The target's final hidden state at the row that predicted ``request``'s last token: the
        prefill's last row, or after a verify step with ``result`` the row of its last accepted
        draft (row 0, the previous last token, when none was accepted)."""
        hidden = request.target_output.hidden_states[-1]
        if result is None:
            return hidden[-1]
        path = result.path()
        return hidden[1 + path[-1] if path else 0]

    def release(self) -> None:
        self.runner.hidden_layers = ()
        self.runner = None
        super().release()


class LastStateResources(HiddenStateResources):
    """Resources of a method that drafts from the target's final hidden state at the row that
    predicted the request's last committed token (Medusa, the MLP speculator, ReDrafter): each
    request's ``method_state`` holds it, from the prefill's last row at ``add_request`` and the
    last accepted row at each :meth:`commit`."""

    def add_request(self, request: Request) -> None:
        request.method_state = self.last_state(request)

    def commit(self, request: Request, result: VerifyResult) -> None:
        """Keep the final hidden state of the row that predicted the new last token (call it from
        ``specdec_accept``)."""
        if not request.finished:
            request.method_state = self.last_state(request, result)
