"""Drafting with an MLP speculator: a chain, or for greedy and seeded requests a tree.

Stage 0 reads the target's final hidden state at the row that predicted the request's last
committed token (captured by the runner: the prefill's last row at ``add_request``, the last
accepted row at ``accept``) and the last committed token; stage ``k`` reads stage ``k - 1``'s state
and the token chosen there.

- A chain (sampled requests without a seed, or ``top_k_tokens_per_head`` all 1): stage ``k``'s
  token is the argmax, or is drawn from its distribution shaped by the request's own sampling
  params, and that distribution goes with it, so the core's rejection sampling stays exact. The
  chains of a batch's requests run stage by stage together.
- With ``draft_vocab_size``, each stage's output layer keeps only the rows of the draft
  vocabulary's tokens; the stages still read every token.
- A tree (greedy and seeded requests): under every node, stage ``d`` keeps its top
  ``top_k_tokens_per_head[d]`` tokens. Of all the nodes, the step's node budget keeps those with
  the highest cumulative log-probability, parents first (a child never scores above its parent),
  and the core verifies the tree against the target's own picks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec import (
    ConfigError,
    DraftProposal,
    LastStateResources,
    Request,
    TargetContext,
    draft_vocabulary,
    drafter_checkpoint,
    is_default_model,
    pick_drafts,
    prepack_linears,
)
from specdec_mlp_speculator.config import MLPSpeculatorDecodingConfig
from specdec_mlp_speculator.speculator import load_speculator


#: The speculator trained for the default target (``specdec train mlp-speculator``; docs/mlp-speculator.md has
#: the recipe). It was trained over the shipped draft vocabulary, which it drafts over unless told otherwise.
SHIPPED_SPECULATOR = Path(__file__).resolve().parent / "weights" / "smollm2-mlp-speculator"


class MLPSpeculatorResources(LastStateResources):
    """The loaded speculator and each request's stage-0 hidden state in ``request.method_state``."""

    def __init__(self, config: MLPSpeculatorDecodingConfig, target: TargetContext) -> None:
        super().__init__(target)
        source = drafter_checkpoint(config.speculative_model, target.model, SHIPPED_SPECULATOR, "an MLP speculator",
                                    "specdec-plugin-mlp-speculator")
        model = load_speculator(source, int(target.model.config.hidden_size), target.vocab_size)
        spec = model.spec
        if config.max_draft_len > spec.n_predict:
            raise ConfigError(f"num_speculative_tokens: {config.max_draft_len} exceeds the speculator's n_predict "
                              f"({spec.n_predict} stages)")
        self.depth = config.max_draft_len
        top_k = config.top_k_tokens_per_head or spec.top_k_tokens_per_head or [1] * spec.n_predict
        if len(top_k) < self.depth or min(top_k) < 1:
            raise ConfigError(f"top_k_tokens_per_head: needs a positive count for each of the {self.depth} draft "
                              f"positions, got {top_k}")
        self.top_k = top_k[: self.depth]
        self.model = model.to(target.device, target.dtype)
        prepack_linears(self.model)
        kept = draft_vocabulary(config, target, shipped=not config.speculative_model and is_default_model(target.model))
        if kept is not None:
            self.model.narrow_vocabulary(kept)
        self.vocab_size = target.vocab_size

    def release(self) -> None:
        self.model = None
        super().release()

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> list[DraftProposal]:
        proposals = [DraftProposal() for _ in requests]
        trees = [i for i, r in enumerate(requests) if r.max_draft_len > 0 and self._drafts_tree(r)]
        chains = [i for i, r in enumerate(requests) if r.max_draft_len > 0 and not self._drafts_tree(r)]
        for i in trees:
            proposals[i] = self._tree(requests[i])
        if chains:
            for i, proposal in zip(chains, self._chains([requests[i] for i in chains])):
                proposals[i] = proposal
        return proposals

    def _drafts_tree(self, request: Request) -> bool:
        return max(self.top_k) > 1 and (request.params.greedy or request.noise is not None)

    def _chains(self, requests: list[Request]) -> list[DraftProposal]:
        lengths = [min(self.depth, r.max_draft_len) for r in requests]
        state = self.model.first_state(torch.stack([r.method_state for r in requests]))
        tokens = torch.tensor([r.token_ids[-1] for r in requests], device=state.device)
        drafts: list[list[int]] = [[] for _ in requests]
        dists: list[list[torch.Tensor | None]] = [[] for _ in requests]
        for stage in range(max(lengths)):
            state, logits = self.model.step(stage, state, tokens)
            picks = pick_drafts(logits, requests, [stage] * len(requests), self.model.token_map, self.vocab_size)
            tokens = torch.tensor([token for token, _ in picks], device=state.device)
            for row, (token, dist) in enumerate(picks):
                if stage < lengths[row]:
                    drafts[row].append(token)
                    dists[row].append(dist)
        return [DraftProposal(d, None if not d or p[0] is None else torch.stack(p)) for d, p in zip(drafts, dists)]

    def _tree(self, request: Request) -> DraftProposal:
        budget = request.max_draft_len
        state = self.model.first_state(request.method_state[None])
        tokens = torch.tensor([request.token_ids[-1]], device=state.device)
        scores = torch.zeros(1, device=state.device)
        frontier = [-1]  # the node index each frontier row stands for (-1: the last committed token)
        nodes: list[tuple[float, int, int, int]] = []  # (score, depth, parent, token)
        for stage, k in enumerate(self.top_k):
            state, logits = self.model.step(stage, state, tokens)
            top = logits.float().log_softmax(-1).topk(k, dim=-1)
            child_scores = (scores[:, None] + top.values).flatten()
            # Only children among the best ``budget`` of this depth can be kept (a child never
            # scores above its parent), so the next stage runs on those alone.
            keep = child_scores.topk(min(budget, child_scores.numel())).indices
            rows = keep // k
            tokens, scores, state = top.indices.flatten()[keep], child_scores[keep], state[rows]
            if self.model.token_map is not None:
                tokens = self.model.token_map[tokens]  # the next stage embeds target ids
            parents = [frontier[r] for r in rows.tolist()]
            frontier = list(range(len(nodes), len(nodes) + len(keep)))
            nodes.extend((s, stage, p, t) for s, p, t in zip(scores.tolist(), parents, tokens.tolist()))
        chosen = sorted(range(len(nodes)), key=lambda n: (-nodes[n][0], nodes[n][1]))[:budget]
        order = {n: position for position, n in enumerate(chosen)}
        return DraftProposal([nodes[n][3] for n in chosen],
                             parents=[-1 if nodes[n][2] < 0 else order[nodes[n][2]] for n in chosen])
