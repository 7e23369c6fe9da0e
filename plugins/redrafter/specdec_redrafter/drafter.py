"""Drafting with ReDrafter: beam search with the recurrent drafter, the beams verified as one tree.

The drafter reads the target's final hidden state at the row that predicted the request's last
committed token (captured by the runner: the prefill's last row at ``add_request``, the last
accepted row at ``accept``) and starts from that token, as Apple's drafter starts from the token
the target predicted. Beam search keeps ``redrafter_num_beams`` beams, each scored by the sum of
its drafts' log-probabilities; only the first beam is live at the first position, so the beams
start from that many different tokens. The beams of a batch's requests search together.

With ``draft_vocab_size`` the drafter's output layer keeps only the rows of the most used
tokens (its costliest part: 49,152 rows for SmolLM2), and the beams draft among those.

Beams that share a prefix share its nodes (Apple's dynamic tree attention), best beam first, so
the step's node budget cuts the weakest beams first. Every draft is deterministic: greedy and
seeded requests keep the path of the target's own picks, sampled ones go through the core's
multi-candidate rejection sampling, and output stays the target's.
"""

from __future__ import annotations

import torch

from specdec import (
    ConfigError,
    DraftProposal,
    DraftTree,
    LastStateResources,
    Request,
    TargetContext,
    draft_vocabulary,
    prepack_linears,
)
from specdec_redrafter.config import ReDrafterDecodingConfig
from specdec_redrafter.drafter_model import (
    RecurrentDrafter,
    beam_log_probs,
    load_drafter,
)


class ReDrafterResources(LastStateResources):
    """The loaded drafter and each request's hidden state in ``request.method_state``."""

    def __init__(self, config: ReDrafterDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        if config.speculative_model is None:
            raise ConfigError("speculative_model: required (a directory in apple/ml-recurrent-drafter's layout); "
                              "none ships for the default target yet")
        model = load_drafter(config.speculative_model, int(target.model.config.hidden_size), target.vocab_size)
        self.model: RecurrentDrafter | None = model.to(target.device, target.dtype)
        prepack_linears(self.model)
        #: The target ids the drafter scores (a draft vocabulary), ``None`` for all of them.
        self.kept = draft_vocabulary(config, target, shipped=False)
        if self.kept is not None:
            self.kept = self.kept.to(target.device)
            self.model.narrow_vocabulary(self.kept)
        self.embed = target.model.get_input_embeddings()
        self.num_beams = config.redrafter_num_beams
        self.depth = config.max_draft_len

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
        beams = self.beam_search(hidden, last, max(depths)).tolist()
        for i, depth, request_beams in zip(rows, depths, beams):
            tree = DraftTree()
            for beam in request_beams:
                tree.add_chain(beam[:depth])
            proposals[i] = DraftProposal(tree.token_ids, parents=tree.parents).truncated(requests[i].max_draft_len)
        return proposals

    def beam_search(self, hidden: torch.Tensor, last: torch.Tensor, depth: int) -> torch.Tensor:
        """``[B, beams, depth]`` drafted tokens, best beam first, for hidden states ``[B, H]`` and
        last committed tokens ``[B]``."""
        batch, width = hidden.shape[0], self.num_beams
        hidden = hidden[:, None].expand(batch, width, hidden.shape[-1])
        state = torch.zeros_like(hidden)
        tokens = last[:, None].expand(batch, width)
        scores = torch.full((batch, width), float("-inf"), device=hidden.device)
        scores[:, 0] = 0.0
        beams = tokens.new_empty(batch, width, 0)
        for _ in range(depth):
            state = self.model.advance(state, self.embed(tokens))
            log_probs = beam_log_probs(self.model.logits(hidden, state))
            vocab = log_probs.shape[-1]
            scores, index = (scores[..., None] + log_probs).view(batch, -1).topk(width, dim=-1)
            origin, tokens = index // vocab, index % vocab
            if self.kept is not None:
                tokens = self.kept[tokens]
            beams = torch.cat([beams.gather(1, origin[..., None].expand(-1, -1, beams.shape[-1])), tokens[..., None]], -1)
            state = state.gather(1, origin[..., None].expand(-1, -1, state.shape[-1]))
        return beams
