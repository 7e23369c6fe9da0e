"""Drafting with ReDrafter: beam search with the recurrent drafter, the beams verified as one tree.

The drafter reads the target's final hidden state at the row that predicted the request's last
committed token (captured by the runner: the prefill's last row at ``add_request``, the last
accepted row at ``accept``) and starts from that token, as Apple's drafter starts from the token
the target predicted. Beam search keeps ``redrafter_num_beams`` beams, each scored by the sum of
its drafts' log-probabilities; only the first beam is live at the first position, so the beams
start from that many different tokens. The beams of a batch's requests search together.

With ``draft_vocab_size`` the drafter's output layer keeps only the rows of the most used
tokens (its costliest part: 49,152 rows for SmolLM2), and the beams draft among those. A compact
drafter (trained over a draft vocabulary) drafts among its own tokens, or the most used of them.

Beams that share a prefix share its nodes (Apple's dynamic tree attention). The nodes come best
first by their prefix's score, so the step's node budget keeps the likeliest nodes of the tree.
Every draft is deterministic: greedy and seeded requests keep the path of the target's own picks,
sampled ones go through the core's multi-candidate rejection sampling, and output stays the
target's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec import (
    DraftProposal,
    DraftTree,
    LastStateResources,
    Request,
    TargetContext,
    draft_ranking,
    draft_vocabulary,
    drafter_checkpoint,
    is_default_model,
    kept_rows,
    prepack_linears,
)
from specdec_redrafter.config import ReDrafterDecodingConfig
from specdec_redrafter.drafter_model import (
    RecurrentDrafter,
    beam_log_probs,
    load_drafter,
)

#: The drafter trained for the default target (``specdec train redrafter``; docs/redrafter.md has the
#: recipe), a compact checkpoint over the shipped draft vocabulary.
SHIPPED_DRAFTER = Path(__file__).resolve().parent / "weights" / "smollm2-redrafter"


class ReDrafterResources(LastStateResources):
    """The loaded drafter and each request's hidden state in ``request.method_state``."""

    def __init__(self, config: ReDrafterDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        source = drafter_checkpoint(config.speculative_model, target.model, SHIPPED_DRAFTER, "a ReDrafter drafter",
                                    "specdec-plugin-redrafter")
        model = load_drafter(source, int(target.model.config.hidden_size), target.vocab_size)
        self.model: RecurrentDrafter | None = model.to(target.device, target.dtype)
        prepack_linears(self.model)
        shipped = not config.speculative_model and is_default_model(target.model)
        #: The target ids the drafter scores (a draft vocabulary), ``None`` for all of them.
        self.kept, rows = self._kept(config, target, model.token_ids, shipped)
        if rows is not None:
            self.model.narrow_vocabulary(rows)
        self.embed = target.model.get_input_embeddings()
        # The checkpoint's own beam search (TensorRT-LLM's converted config keeps it), unless set here.
        spec, given = model.spec, config.model_fields_set
        tuned = spec.redrafter_num_beams and "redrafter_num_beams" not in given
        self.num_beams = spec.redrafter_num_beams if tuned else config.redrafter_num_beams
        tuned = spec.redrafter_draft_len_per_beam and "max_draft_len" not in given
        self.depth = spec.redrafter_draft_len_per_beam if tuned else config.max_draft_len

    @staticmethod
    def _kept(config: ReDrafterDecodingConfig, target: TargetContext, token_ids: torch.Tensor | None,
              shipped: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The target ids the drafter will score and the output rows that keep them (``None``: all
        rows). A compact drafter scores its own vocabulary unless ``draft_vocab_size`` narrows it."""
        if token_ids is None:
            kept = draft_vocabulary(config, target, shipped)
            return (None, None) if kept is None else (kept.to(target.device), kept)
        ranked = draft_ranking(config, target, shipped, shipped_size=None)
        rows = None if ranked is None else kept_rows(ranked[0], token_ids, ranked[1])
        kept = token_ids if rows is None else token_ids[rows]
        return kept.to(target.device), rows

    def release(self) -> None:
        self.model = None
        self.embed = None
        super().release()

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        proposals = [DraftProposal() for _ in requests]
        rows = [i for i, r in enumerate(requests) if r.max_draft_len > 0]
        if not rows:
            return proposals
        depths = [min(self.depth, requests[i].max_draft_len) for i in rows]
        hidden = torch.stack([requests[i].method_state for i in rows])
        last = torch.tensor([requests[i].token_ids[-1] for i in rows], device=hidden.device)
        beams, scores = self.beam_search(hidden, last, max(depths))
        for i, depth, request_beams, request_scores in zip(rows, depths, beams.tolist(), scores.tolist()):
            proposals[i] = best_first_tree(request_beams, request_scores, depth, requests[i].max_draft_len)
        return proposals

    def beam_search(self, hidden: torch.Tensor, last: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, beams, depth]`` drafted tokens, best beam first, for hidden states ``[B, H]`` and
        last committed tokens ``[B]``, and each beam's score after each depth (the summed
        log-probabilities of its drafts so far), ``[B, beams, depth]``."""
        batch, width = hidden.shape[0], self.num_beams
        hidden = hidden[:, None].expand(batch, width, hidden.shape[-1])
        state = torch.zeros_like(hidden)
        tokens = last[:, None].expand(batch, width)
        scores = torch.full((batch, width), float("-inf"), device=hidden.device)
        scores[:, 0] = 0.0
        beams = tokens.new_empty(batch, width, 0)
        history = scores.new_empty(batch, width, 0)
        for _ in range(depth):
            state = self.model.advance(state, self.embed(tokens))
            log_probs = beam_log_probs(self.model.logits(hidden, state))
            vocab = log_probs.shape[-1]
            scores, index = (scores[..., None] + log_probs).view(batch, -1).topk(width, dim=-1)
            origin, tokens = index // vocab, index % vocab
            if self.kept is not None:
                tokens = self.kept[tokens]
            beams = torch.cat([beams.gather(1, origin[..., None].expand(-1, -1, beams.shape[-1])), tokens[..., None]], -1)
            history = torch.cat([history.gather(1, origin[..., None].expand(-1, -1, history.shape[-1])), scores[..., None]], -1)
            state = state.gather(1, origin[..., None].expand(-1, -1, state.shape[-1]))
        return beams, history


def best_first_tree(beams: list[list[int]], scores: list[list[float]], depth: int, budget: int) -> DraftProposal:
    """The beams' first ``depth`` drafts as one tree, beams sharing a prefix sharing its nodes, of
    which the ``budget`` with the best prefix scores (``scores[b][d]``: beam ``b``'s after depth
    ``d``) come first and are kept. A node never scores above its parent, so parents come first,
    and a budget smaller than the tree keeps its likeliest nodes (say the second beam's first
    draft before the first beam's fifth)."""
    prefixes: dict[tuple[int, ...], float] = {}
    for beam, beam_scores in zip(beams, scores):
        for d in range(depth):
            prefixes.setdefault(tuple(beam[: d + 1]), beam_scores[d])
    tree = DraftTree()
    for prefix in sorted(prefixes, key=lambda p: (-prefixes[p], len(p)))[:budget]:
        tree.add_chain(prefix)
    return DraftProposal(tree.token_ids, parents=tree.parents)
