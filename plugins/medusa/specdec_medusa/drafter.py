"""Drafting with Medusa heads: a static tree for greedy and seeded requests, a sampled chain otherwise.

Every head reads one vector per request: the target's final normed hidden state at the row
that predicted the request's last committed token. The target's own forwards provide it at no
extra cost (the runner captures hidden states): the prefill's last row at ``add_request``, and at
``accept`` the row of the last accepted draft (row 0, the previous last token, when none was
accepted). Heads ``0..depth-1`` then run once for the whole batch.

- Greedy and seeded requests (and every request under typical acceptance) get the tree of
  ``medusa_choices``: the node at path ``(i_1, ..., i_d)`` is head ``d``'s top-``i_d`` token.
  It is cut to the step's node budget by keeping its first nodes (parents come first). The core
  verifies it against the target's own picks, so the output is exactly plain decoding's.
- Sampled requests without a seed get a chain of ``min(depth, budget)`` tokens: draft ``k`` is
  drawn from head ``k``'s distribution shaped by the request's own temperature / top-k / top-p,
  and that distribution goes with it. Head ``k``'s distribution does not depend on the drafts
  before it, so each draft really is drawn from the ``q`` it carries, and the core's rejection
  sampling keeps the output distributed as the target's. The core verifies trees only against a
  pick, which an unseeded request does not have; a chain is the lossless choice.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from specdec import (
    ConfigError,
    DraftProposal,
    LastStateResources,
    RecordedCalls,
    Request,
    TargetContext,
    draft_vocabulary,
    drafter_checkpoint,
    parents_of_paths,
    pick_drafts,
    prepack_linears,
)
from specdec_medusa.checkpoint import load_heads
from specdec_medusa.config import MedusaDecodingConfig

logger = logging.getLogger(__name__)

#: The heads trained for the default target by ``specdec train medusa`` (see docs/medusa.md).
SHIPPED_HEADS = Path(__file__).resolve().parent / "weights" / "smollm2-medusa"


class MedusaResources(LastStateResources):
    """The loaded heads, the draft tree, and each request's head input in ``request.method_state``."""

    def __init__(self, config: MedusaDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        source = drafter_checkpoint(config.speculative_model, target.model, SHIPPED_HEADS, "a set of Medusa heads",
                                    "specdec-plugin-medusa")
        model_config = target.model.config
        heads = load_heads(source, int(model_config.hidden_size), target.vocab_size, config.num_medusa_heads,
                           target.model.get_output_embeddings().weight)
        heads = heads.to(target.device, target.dtype)
        prepack_linears(heads)
        # The shipped heads draft over the shipped draft vocabulary unless told otherwise.
        kept = draft_vocabulary(config, target, shipped=config.speculative_model is None)
        if kept is not None:
            heads.narrow_vocabulary(kept)
        self.tree = _fit_tree(config, heads.num_heads)
        self.parents = parents_of_paths(self.tree)
        self.depth = max(len(node) for node in self.tree)
        #: How many top tokens each depth's tree nodes choose from.
        self.topk = [1 + max(node[-1] for node in self.tree if len(node) == d) for d in range(1, self.depth + 1)]
        if max(self.topk) > heads.lm_heads[0].out_features:
            raise ConfigError(f"medusa_choices: a top-{max(self.topk) - 1} index exceeds the heads' vocabulary")
        self.config = config
        self.heads = heads
        self.vocab_size = target.vocab_size
        # Where the target's forwards are captured, the heads' top tokens are too: one recorded
        # call for the batch, padded to the engine's largest (specdec.static_draft).
        self.recorded = RecordedCalls.like_target(target, self.setup_clock)
        self.max_rows = target.max_batch_size
        if not config.lossless:
            logger.warning(
                "Medusa typical acceptance is on: sampled outputs are NOT distributed as the target's "
                "(posterior_threshold=%s, posterior_alpha=%s)", config.posterior_threshold, config.posterior_alpha,
            )

    def release(self) -> None:
        self.heads = self.recorded = None
        super().release()

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        """One proposal per request within its budget of ``request.max_draft_len`` nodes; the
        heads run once over every drafting request's own hidden state."""
        proposals = [DraftProposal() for _ in requests]
        drafting = [i for i, r in enumerate(requests) if r.max_draft_len > 0]
        if not drafting:
            return proposals
        hidden = torch.stack([requests[i].method_state for i in drafting])
        trees = [self._drafts_tree(requests[i]) for i in drafting]
        logits = top = None
        if all(trees) and self.recorded is not None:
            padded = hidden.new_zeros(self.max_rows, hidden.shape[-1])
            padded[: len(drafting)] = hidden
            top = self.recorded("top", lambda h: self._top(self.heads(h)[: self.depth]), [padded])[:, : len(drafting)]
        else:
            logits = self.heads(hidden)[: self.depth]  # [depth, B, head_vocab]
            top = self._top(logits) if any(trees) else None
        # Every tree of the batch from one transfer: per depth, per row, the best tokens.
        top = top.tolist() if top is not None else None
        for row, i in enumerate(drafting):
            request = requests[i]
            if trees[row]:
                proposals[i] = self._tree([best[row] for best in top], request.max_draft_len)
            else:
                proposals[i] = self._chain(logits[:, row], request)
        return proposals

    def _top(self, logits: torch.Tensor) -> torch.Tensor:
        """``[depth, rows, k]`` target ids of each head's best ``k`` tokens, best first, ``k`` the
        most any depth of the tree chooses from."""
        return self.heads.target_ids(logits.topk(max(self.topk), dim=-1).indices)

    def _drafts_tree(self, request: Request) -> bool:
        return request.params.greedy or request.noise is not None or not self.config.lossless

    def _tree(self, top: list[list[int]], budget: int) -> DraftProposal:
        """The tree's first ``budget`` nodes, each its depth's head's top-``i`` token (``top[d]``:
        head ``d``'s best tokens, best first)."""
        nodes = self.tree[:budget]
        return DraftProposal([top[len(node) - 1][node[-1]] for node in nodes], parents=self.parents[: len(nodes)])

    def _chain(self, logits: torch.Tensor, request: Request) -> DraftProposal:
        """Draft ``k`` drawn from head ``k``'s distribution, shaped by the request's params."""
        length = min(self.depth, request.max_draft_len)
        picks = pick_drafts(logits[:length], [request] * length, range(length), self.heads.token_map, self.vocab_size)
        return DraftProposal([token for token, _ in picks], torch.stack([dist for _, dist in picks]))


def _fit_tree(config: MedusaDecodingConfig, num_heads: int) -> list[tuple[int, ...]]:
    """The configured tree, cut to the heads loaded; a tree the user gave must fit them whole."""
    tree = config.tree()
    deepest = max(len(node) for node in tree)
    if deepest > num_heads and config.medusa_choices is not None:
        raise ConfigError(
            f"medusa_choices: paths {deepest} deep need {deepest} heads, the checkpoint provides {num_heads}; "
            f"shorten the paths or set max_draft_len to {num_heads}"
        )
    return [node for node in tree if len(node) <= num_heads]
