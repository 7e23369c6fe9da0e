"""Drafts come from the heads at the right hidden state: each node is its depth's head's top-i
token at the target's final state for the last committed token; budgets cut the tree to its
first nodes; unseeded sampled requests get a chain with its distributions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from medusa_tiny import fitted_heads, save_vllm

from specdec import LLM, SamplingParams
from specdec.testing import make_tiny_target
from specdec.testing.recording import drafts_by_execution
from specdec_medusa.drafter import MedusaResources

CHOICES = [[0, 0, 0], [0, 1], [1, 0], [2]]
TREE = [(0,), (0, 0), (0, 0, 0), (0, 1), (1,), (1, 0), (2,)]
PROMPTS = ("the cat sat on the mat. the cat", "hello world, hello", "abc abd abe ab")


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(seed=0)


@pytest.fixture(scope="module")
def heads_dir(target, tmp_path_factory) -> Path:
    return save_vllm(fitted_heads(target.model), tmp_path_factory.mktemp("heads"))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every request with a budget as (tokens so far, budget, greedy/seeded/unseeded, proposal)."""
    seen = []
    propose = MedusaResources.propose

    def recording(self, requests):
        proposals = propose(self, requests)
        for request, proposal in zip(requests, proposals):
            if request.max_draft_len == 0:
                assert len(proposal) == 0
                continue
            kind = "greedy" if request.params.greedy else "seeded" if request.noise is not None else "unseeded"
            seen.append((list(request.token_ids), request.max_draft_len, kind, proposal, self))
        return proposals

    monkeypatch.setattr(MedusaResources, "propose", recording)
    return seen


@torch.no_grad()
def _expected_tree(model: torch.nn.Module, manager: MedusaResources, token_ids: list[int]) -> list[int]:
    """The tree recomputed plainly: a fresh forward up to the last token's predecessor, its final
    hidden state through the heads, each node the top-i token of its depth's head."""
    hidden = model(torch.tensor([token_ids[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
    logits = manager.heads(hidden[None])[:, 0]
    ranked = [manager.heads.target_ids(logits[d].argsort(descending=True)).tolist() for d in range(manager.depth)]
    return [ranked[len(node) - 1][node[-1]] for node in TREE]


@pytest.mark.parametrize("execution", ["eager", "static"])
def test_tree_nodes_are_the_heads_top_tokens_at_the_true_state(target, heads_dir, monkeypatch, execution) -> None:
    """Also where the target runs in fixed shapes (``static``, as CUDA graphs do): the heads' top
    tokens then come from one recorded call for the batch, padded to its largest size."""
    seen = _recording(monkeypatch)
    config = {"method": "medusa", "model": str(heads_dir), "medusa_choices": CHOICES, "adaptive_draft_len": False}
    with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=2, execution=execution) as llm:
        assert (llm.engine.resource_manager.recorded is None) == (execution == "eager")
        outputs = llm.generate([{"prompt_token_ids": target.encode(t)} for t in PROMPTS], SamplingParams(max_tokens=20))
        trees = [(ids, budget, proposal, manager) for ids, budget, kind, proposal, manager in seen if kind == "greedy"]
        assert trees and sum(o.metrics.num_accepted_tokens for o in outputs) > 0
        for ids, budget, proposal, manager in trees:
            assert manager.tree == TREE
            n = min(budget, len(TREE))
            assert proposal.token_ids == _expected_tree(target.model, manager, ids)[:n]
            assert proposal.parents == [-1, 0, 1, 0, -1, 4, -1][:n]
            assert proposal.probs is None


def test_unseeded_sampled_requests_draft_a_chain_with_its_distributions(target, heads_dir, monkeypatch) -> None:
    seen = _recording(monkeypatch)
    config = {"method": "medusa", "model": str(heads_dir), "adaptive_draft_len": False}
    params = [SamplingParams(temperature=0.8, top_k=5, max_tokens=12), SamplingParams(temperature=0.8, max_tokens=12, seed=3)]
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        llm.generate([{"prompt_token_ids": target.encode(PROMPTS[0])}] * 2, params)
    chains = [(budget, p, m) for _, budget, kind, p, m in seen if kind == "unseeded"]
    seeded = [p for _, _, kind, p, _ in seen if kind == "seeded"]
    assert chains and seeded
    for budget, proposal, manager in chains:
        # The depth of the heads (3), or less on a last step with fewer tokens left.
        assert proposal.parents is None and len(proposal) == min(manager.depth, budget)
        assert proposal.probs.shape == (len(proposal), target.model.config.vocab_size)
        assert ((proposal.probs > 0).sum(-1) <= 5).all()  # shaped by the request's top_k
    assert any(len(proposal) == 3 for _, proposal, _ in chains)
    assert all(p.parents is not None for p in seeded)


def test_a_small_budget_keeps_the_first_nodes(target, heads_dir, monkeypatch) -> None:
    """A draft_len_schedule of 2 nodes: every proposal is the tree's first two nodes."""
    seen = _recording(monkeypatch)
    config = {"method": "medusa", "model": str(heads_dir), "medusa_choices": CHOICES, "adaptive_draft_len": False,
              "draft_len_schedule": {8: 2}}
    with LLM(target.model, config, tokenizer=target.tokenizer) as llm:
        llm.generate({"prompt_token_ids": target.encode(PROMPTS[1])}, SamplingParams(max_tokens=10))
    # The last steps' budgets are smaller still: the request runs out of tokens.
    assert [budget for _, budget, _, _, _ in seen].count(2) > 1
    assert all(budget <= 2 and p.parents == [-1, 0][:budget] for _, budget, _, p, _ in seen)


def test_draft_vocabulary_trees_and_chains_hold_only_kept_tokens(target, heads_dir, tmp_path, monkeypatch) -> None:
    """With ``draft_vocab_size``, each tree node is its head's top-i token among the kept ones
    (the trimmed rows map back to the right ids) and a sampled chain's distributions are zero off
    the kept tokens; heads that already truncate their vocabulary (vLLM's token_map) are refused."""
    from specdec import ConfigError
    from specdec.draft_vocab import kept_tokens, load_ranking
    from specdec.testing.tiny import shuffled_ranking

    vocab = target.model.config.vocab_size
    ranking = shuffled_ranking(vocab, tmp_path / "ranking.safetensors")
    allowed = kept_tokens(load_ranking(ranking, vocab), 24, "test").tolist()
    seen = _recording(monkeypatch)
    config = {"method": "medusa", "model": str(heads_dir), "medusa_choices": CHOICES, "adaptive_draft_len": False,
              "draft_vocab": str(ranking), "draft_vocab_size": 24}
    with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=2) as llm:
        prompts = [{"prompt_token_ids": target.encode(t)} for t in PROMPTS]
        llm.generate(prompts, SamplingParams(max_tokens=20))
        llm.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0))
        trees = [(ids, budget, proposal, manager) for ids, budget, kind, proposal, manager in seen if kind == "greedy"]
        chains = [proposal for _, _, kind, proposal, _ in seen if kind == "unseeded"]
        assert trees and chains
        for ids, budget, proposal, manager in trees:
            assert manager.heads.lm_heads[0].out_features == 24 and set(proposal.token_ids) <= set(allowed)
            assert proposal.token_ids == _expected_tree(target.model, manager, ids)[: min(budget, len(TREE))]
    off = sorted(set(range(vocab)) - set(allowed))
    assert all(float(p.probs[:, off].sum()) == 0 and set(p.token_ids) <= set(allowed) for p in chains)

    truncated = save_vllm(fitted_heads(target.model), tmp_path / "truncated", token_map=torch.arange(vocab)[3:])
    with pytest.raises(ConfigError, match="draft_vocab_size: these heads already project onto a truncated vocabulary"):
        LLM(target.model, {**config, "model": str(truncated)}, tokenizer=target.tokenizer)


def test_a_batch_of_trees_reads_the_device_once(target, heads_dir, monkeypatch) -> None:
    """Every tree of a drafting step comes from one read of the heads' top tokens (on CUDA each
    read waits for the device; here the same calls are counted)."""
    reads = []
    propose = MedusaResources.propose

    def counted(self, requests):
        count = [0]
        tolist = torch.Tensor.tolist

        def read(tensor, *args, **kwargs):
            count[0] += 1
            return tolist(tensor, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "tolist", read)
            proposals = propose(self, requests)
        if any(len(p) for p in proposals):
            reads.append(count[0])
        return proposals

    monkeypatch.setattr(MedusaResources, "propose", counted)
    config = {"method": "medusa", "model": str(heads_dir), "medusa_choices": CHOICES, "adaptive_draft_len": False}
    with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=3) as llm:
        llm.generate([{"prompt_token_ids": target.encode(t)} for t in PROMPTS], SamplingParams(max_tokens=12))
    assert reads and set(reads) == {1}, reads


def test_recorded_heads_draft_as_the_static_call(heads_dir, device, monkeypatch) -> None:
    """Where the heads and their top tokens are recorded (a CUDA graph on CUDA, the default there;
    its emulation elsewhere) and replayed, every tree and output equals the same call run
    unrecorded (``static``, checked against the heads above)."""
    target = make_tiny_target(seed=0, device=device)
    config = {"method": "medusa", "model": str(heads_dir), "medusa_choices": CHOICES}
    runs = drafts_by_execution(target.model, config, target.tokenizer, MedusaResources, monkeypatch,
                               [{"prompt_token_ids": target.encode(text)} for text in PROMPTS])
    assert runs["cuda_graph"][2] > 0, "nothing was recorded"
    assert runs["cuda_graph"][:2] == runs["static"][:2]
