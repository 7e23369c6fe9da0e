"""specdec hook implementations for lookahead decoding."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

from specdec import (
    DraftProposal,
    DraftTree,
    Request,
    ResourceManager,
    SpeculativeConfig,
    TargetContext,
    VerifyResult,
    hookimpl,
)
from specdec_lookahead.config import LookaheadDecodingConfig
from specdec_lookahead.pool import NGramPool
from specdec_lookahead.window import LookaheadWindow


@dataclass
class LookaheadState:
    """One request's window and pool, the tokens its pool has seen, and where this step's
    proposal put the window's last row (``None``: the window was not drafted)."""

    window: LookaheadWindow
    pool: NGramPool
    seen: int
    last_row_nodes: list[int] | None = None


class LookaheadResources(ResourceManager):
    """Each request's :class:`LookaheadState` (``request.method_state``)."""

    #: The window and the pool cost a few dictionary lookups whatever the tree's size.
    draft_cost_per_token = False

    def __init__(self, config: LookaheadDecodingConfig) -> None:
        super().__init__()
        self.config = config

    def add_request(self, request: Request) -> None:
        c = self.config
        prompt = request.token_ids[: request.num_prompt_tokens]
        pool = NGramPool(c.max_ngram_size, c.max_verification_set_size)
        pool.add_sequence(request.token_ids)
        window = LookaheadWindow(c.max_window_size, c.max_ngram_size, prompt, zlib.crc32(bytes(str(prompt), "ascii")))
        request.method_state = LookaheadState(window, pool, len(request.token_ids))

    def free_request(self, request: Request) -> None:
        request.method_state = None

    def propose(self, request: Request) -> DraftProposal:
        """The pool's n-grams after the last token, newest first, then the window's guesses when
        the budget holds them all: best first, as the engine's policy cuts a tree from its end
        (on hardware where a wide verify costs more than the window's n-grams repay, the policy
        keeps the window out and the step verifies the pool alone)."""
        state: LookaheadState = request.method_state
        budget = request.max_draft_len
        tree = DraftTree()
        for continuation in state.pool.candidates(request.token_ids[-1]):
            tree.add_chain(continuation)
        tree_budget = len(tree) + state.window.size
        state.last_row_nodes = state.window.lay_out(tree) if tree_budget <= budget else None
        return DraftProposal(tree.token_ids, parents=tree.parents).truncated(budget)

    def accept(self, request: Request, result: VerifyResult) -> None:
        state: LookaheadState = request.method_state
        next_row = None
        nodes = state.last_row_nodes
        # The engine may have cut the proposal (a grammar, the policy): the rows it forwarded say.
        if nodes is not None and max(nodes) < request.target_output.logits.shape[0] - 1:
            next_row = request.target_output.logits[[1 + n for n in nodes]].argmax(-1).tolist()
        state.window.advance(next_row, len(request.token_ids) - state.seen, state.pool)
        state.pool.add_sequence(request.token_ids, state.seen)
        state.seen = len(request.token_ids)


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "lookahead",
        LookaheadDecodingConfig,
        aliases=("Lookahead", "lookahead_decoding"),
        summary="Lookahead decoding: Jacobi iteration guesses n-grams, verified with the pool's in one forward.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return LookaheadResources(config) if isinstance(config, LookaheadDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: LookaheadResources
) -> list[DraftProposal] | None:
    if not isinstance(config, LookaheadDecodingConfig):
        return None
    return [resource_manager.propose(r) for r in requests]


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: LookaheadResources
) -> None:
    if isinstance(config, LookaheadDecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.accept(request, result)
