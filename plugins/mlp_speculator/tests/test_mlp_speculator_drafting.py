"""The speculator's tree, checked against a brute-force one: every node of the full tree under
``top_k_tokens_per_head`` scored by its cumulative log-probability, the best ``budget`` kept. With
a draft vocabulary the brute force masks the logits outside it, so the narrowed output layers
must give the same tree, each stage embedding the target ids chosen before it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mlp_tiny import fitted_speculator

from specdec import LLM, SamplingParams
from specdec.testing.tiny import shuffled_ranking
from specdec_mlp_speculator import save_speculator


def brute_force_tree(model, hidden, last, top_k, budget, kept=None):
    """[(token, parent index)] of the best ``budget`` nodes, parents first, ties by depth."""
    nodes = []  # (score, depth, parent, token)

    def expand(state, token, score, parent, stage):
        if stage == len(top_k):
            return
        state, logits = model.step(stage, state, torch.tensor([token]))
        logits = logits.float()
        if kept is not None:
            masked = torch.full_like(logits, float("-inf"))
            masked[:, kept] = logits[:, kept]
            logits = masked
        top = logits.log_softmax(-1)[0].topk(top_k[stage])
        for value, child in zip(top.values.tolist(), top.indices.tolist()):
            nodes.append((score + value, stage, parent, child))
            expand(state, child, score + value, len(nodes) - 1, stage + 1)

    expand(model.first_state(hidden[None]), last, 0.0, -1, 0)
    chosen = sorted(range(len(nodes)), key=lambda n: (-nodes[n][0], nodes[n][1]))[:budget]
    order = {n: i for i, n in enumerate(chosen)}
    return [(nodes[n][3], -1 if nodes[n][2] < 0 else order[nodes[n][2]]) for n in chosen]


@pytest.mark.parametrize("narrowed", [False, True], ids=["full", "draft-vocabulary"])
def test_tree_is_the_best_nodes_of_the_whole_tree(tiny, tmp_path, narrowed):
    speculator = fitted_speculator(tiny.model, top_k=[3, 3, 2])
    directory = save_speculator(speculator, tmp_path / "s")
    config = {"method": "mlp_speculator", "model": str(directory), "num_draft_tokens": 9, "adaptive_draft_len": False}
    kept = None
    if narrowed:
        ranking = shuffled_ranking(tiny.model.config.vocab_size, tmp_path / "ranking.safetensors")
        config.update(draft_vocab=str(ranking), draft_vocab_size=20)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        resources = llm.engine.resource_manager
        if narrowed:
            kept = resources.model.token_map.cpu()
        generator = torch.Generator().manual_seed(0)
        for last in (5, 11, 23):
            hidden = torch.randn(tiny.model.config.hidden_size, generator=generator)
            request = SimpleNamespace(method_state=hidden, token_ids=[3, last], max_draft_len=9,
                                      params=SamplingParams(), noise=None)
            proposal = resources._tree(request)
            expected = brute_force_tree(speculator, hidden, last, [3, 3, 2], 9, kept)
            assert list(zip(proposal.token_ids, proposal.parents)) == expected
