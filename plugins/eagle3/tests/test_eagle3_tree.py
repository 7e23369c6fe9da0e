"""EAGLE-2 tree drafting: lossless greedy output, real branching, a head cache that stays in step,
and chains for sampled requests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eagle3_tiny import fitted_head
from torch.nn import functional as F

from specdec import LLM, SamplingParams
from specdec.draft_policy import ContextCost, ForwardCost, StepTime
from specdec.errors import ConfigError
from specdec.testing import make_tiny_target
from specdec_eagle3 import save_head
from specdec_eagle3.drafter import Eagle3Resources
from specdec.trees import TreeCandidates
from specdec_eagle3.tree import frontier_mask

PROMPTS = ("the cat sat on the mat. the cat", "hello world, hello", "one two three, one two", "abc abd abe ab")
DEPTH, TOPK, NODES = 3, 3, 8


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(seed=0)


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory) -> Path:
    return save_head(fitted_head(target.model, (0, 1)), tmp_path_factory.mktemp("fitted"), "speculators")


@pytest.fixture(scope="module")
def deep_head_dir(target, tmp_path_factory) -> Path:
    """A fitted head with two decoder layers (speculators layout, as vLLM reads multi-layer heads)."""
    return save_head(fitted_head(target.model, (0, 1), num_layers=2), tmp_path_factory.mktemp("deep"), "speculators")


@pytest.fixture(scope="module")
def expected(target) -> dict[str, list[int]]:
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    return {text: plain.generate({"prompt_token_ids": target.encode(text)}, params)[0].token_ids for text in PROMPTS}


def _config(head_dir: Path, **options) -> dict:
    return {"method": "eagle3", "model": str(head_dir), "max_draft_len": DEPTH, "eagle_topk": TOPK,
            "num_draft_tokens": NODES, "adaptive_draft_len": False, **options}


def _recording(monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """Record every proposal (tokens so far, kind of request, node budget, proposal) and every
    committed (proposal, result); the kind is ``greedy``, ``seeded`` or ``unseeded``."""
    proposals, results = [], []
    latest = {}
    propose, commit = Eagle3Resources.propose, Eagle3Resources.commit

    def recording_propose(self, requests):
        drafted = propose(self, requests)
        for request, proposal in zip(requests, drafted):
            kind = "greedy" if request.params.greedy else "seeded" if request.noise is not None else "unseeded"
            proposals.append((list(request.token_ids), kind, request.max_draft_len, proposal))
            latest[request.request_id] = proposal
        return drafted

    def recording_commit(self, request, result):
        results.append((latest.pop(request.request_id, None), result))
        commit(self, request, result)

    monkeypatch.setattr(Eagle3Resources, "propose", recording_propose)
    monkeypatch.setattr(Eagle3Resources, "commit", recording_commit)
    return proposals, results


def _paths(token_ids: list[int], parents: list[int]) -> set[tuple[int, ...]]:
    """Each node as the token path from the root down to it."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(token_ids, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return set(paths)


@torch.no_grad()
def _tree_from_scratch(
    manager: Eagle3Resources, model: torch.nn.Module, token_ids: list[int], depth: int, nodes: int
) -> set[tuple[int, ...]]:
    """The EAGLE-2 tree recomputed plainly: no head cache, no masks, no batching. Every node's head
    state is a causal pass over the true pairs followed by its own path (each draft fed the head's
    output at its parent); candidates are expanded and reranked with Python sorts."""
    head, embed = manager.head, model.get_input_embeddings()
    hidden_states = [h[0] for h in model(torch.tensor([token_ids[:-1]]), output_hidden_states=True).hidden_states]
    true_embeds = embed(torch.tensor([token_ids[1:]]))
    true_inputs = head.fuse(manager.features(tuple(hidden_states))[None])

    def state(path: tuple[int, ...], outputs: list[torch.Tensor]) -> torch.Tensor:
        embeds = torch.cat([true_embeds, embed(torch.tensor([list(path)], dtype=torch.long))], 1)
        inputs = torch.cat([true_inputs, torch.stack(outputs)[None]], 1) if outputs else true_inputs
        return head(embeds, inputs, torch.arange(embeds.shape[1])[None])[0, -1]

    root = state((), [])
    frontier = [((), 0.0, root, [])]
    candidates: list[tuple[tuple[int, ...], float]] = []
    for level in range(depth):
        children = []
        for path, score, out, outputs in frontier:
            values, ids = F.log_softmax(head.logits(out).float(), -1).topk(TOPK)
            for value, i in zip(values.tolist(), ids.tolist()):
                children.append((path + (int(manager.draft_ids[i]),), score + value, outputs + [out]))
        candidates += [(path, score) for path, score, _ in children]
        best = sorted(children, key=lambda c: -c[1])[:TOPK]
        if level + 1 < depth:
            frontier = [(path, score, state(path, outputs), outputs) for path, score, outputs in best]
    return {path for path, _ in sorted(candidates, key=lambda c: -c[1])[:nodes]}


def test_candidates_rerank_into_a_tree_with_parents_first() -> None:
    """The best nodes by cumulative log-prob form a tree laid out parents first, even when a deep
    node outscores a shallow one and when a child ties its parent (log-prob 0)."""
    candidates = TreeCandidates(torch.device("cpu"))
    vocab = torch.arange(10, 14)
    root = torch.tensor([-1])
    logprobs = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    first, scores, tokens = candidates.add_children(root, torch.zeros(1), logprobs, vocab, 2)
    assert first.tolist() == [0, 1] and tokens.tolist() == [10, 11]
    children = torch.log(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]]))
    second, _, _ = candidates.add_children(first, scores, children, vocab, 2)
    assert second.tolist() == [2, 3, 4, 5]
    token_ids, parents = candidates.best(4)
    # Scores: 10: .5, 11: .3, 10>10: .5 (ties its parent), 10>11: 0, 11>13: .12, 11>12: .09.
    assert (token_ids, parents) == ([10, 10, 11, 13], [-1, 0, -1, 2])
    # A cut keeps the best nodes: every shorter selection is a leading run of a longer one.
    for n in range(1, 6):
        shorter, longer = candidates.best(n), candidates.best(6)
        assert shorter == (longer[0][:n], longer[1][:n])


def test_frontier_mask_sees_committed_ancestors_and_itself() -> None:
    ancestors = torch.tensor([[True, False], [False, True]])
    mask = frontier_mask(3, ancestors)
    assert mask.tolist() == [[True] * 3 + [True, False] + [True, False], [True] * 3 + [False, True] + [False, True]]


@pytest.mark.parametrize(("max_batch_size", "num_layers"), [(1, 1), (3, 1), (3, 2)])
def test_greedy_trees_equal_plain_greedy_and_the_cache_stays_in_step(
    target, head_dir, deep_head_dir, expected, monkeypatch, max_batch_size, num_layers
) -> None:
    """Alone and in a batch, tree output equals plain greedy, every proposal is a real tree of
    ``num_draft_tokens`` nodes (or the step's budget), and every proposal equals the tree recomputed
    from scratch with the true target features: the head cache keeps exactly the accepted paths,
    in every decoder layer of a multi-layer head too."""
    head_dir = head_dir if num_layers == 1 else deep_head_dir
    proposals, _ = _recording(monkeypatch)
    with LLM(target.model, _config(head_dir), tokenizer=target.tokenizer, max_batch_size=max_batch_size) as llm:
        outputs = llm.generate([{"prompt_token_ids": target.encode(t)} for t in PROMPTS],
                               SamplingParams(max_tokens=32, ignore_eos=True))
        manager = llm.engine.resource_manager
        assert [o.token_ids for o in outputs] == [expected[t] for t in PROMPTS]
        assert llm.get_metrics().num_accepted_tokens > len(PROMPTS)
        for tokens, _, budget, proposal in proposals:
            if budget == 0:
                # A request one token from its end, in a batch that drafts for the others.
                assert len(proposal) == 0
                continue
            assert len(proposal) == min(NODES, budget) and proposal.parents is not None
            reference = _tree_from_scratch(manager, target.model, tokens, min(DEPTH, budget), min(NODES, budget))
            assert _paths(proposal.token_ids, proposal.parents) == reference
        assert sum(len(p) == NODES and p.parents.count(-1) > 1 for *_, p in proposals) > len(PROMPTS), "no real trees"


def test_trees_accept_other_branches_and_more_tokens_than_the_chain(target, head_dir, expected, monkeypatch) -> None:
    """The verifier sometimes keeps a path that leaves the head's top choice (a node that is not
    its parent's first child), and the tree accepts more tokens per step than a chain of the same
    depth on the same prompts."""
    _, results = _recording(monkeypatch)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    prompts = [{"prompt_token_ids": target.encode(t)} for t in PROMPTS]
    with LLM(target.model, _config(head_dir), tokenizer=target.tokenizer) as llm:
        llm.generate(prompts, params)
        tree = llm.get_metrics()
    with LLM(target.model, _config(head_dir, eagle_topk=1, num_draft_tokens=None), tokenizer=target.tokenizer) as llm:
        llm.generate(prompts, params)
        chain = llm.get_metrics()
    side_branches = [(p, r) for p, r in results if r.accepted_nodes and _leaves_first_choices(p.parents, r.accepted_nodes)]
    assert side_branches, "every accepted path followed the head's first choices: the tree never helped"
    assert tree.mean_acceptance_length > chain.mean_acceptance_length


def _leaves_first_choices(parents: list[int], path: list[int]) -> bool:
    """Whether some node of ``path`` is not the first (best-scoring) child of its parent."""
    first_child: dict[int, int] = {}
    for node, parent in enumerate(parents):
        first_child.setdefault(parent, node)
    return any(first_child[parents[node]] != node for node in path)


def test_unseeded_sampled_requests_draft_chains(target, head_dir, expected, monkeypatch) -> None:
    """With tree options set, a batch mixing greedy, seeded and unseeded sampled requests drafts
    trees for the greedy and seeded ones (the core keeps the path of the target's own picks) and
    chains with their distributions for the unseeded ones (rejection sampling verifies chains);
    greedy output still equals plain greedy."""
    proposals, _ = _recording(monkeypatch)
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    unseeded = SamplingParams(temperature=1.0, top_k=3, max_tokens=16, ignore_eos=True)
    seeded = unseeded.model_copy(update={"seed": 3})
    ids = target.encode(PROMPTS[0])
    with LLM(target.model, _config(head_dir), tokenizer=target.tokenizer, max_batch_size=3) as llm:
        outputs = llm.generate([{"prompt_token_ids": ids}] * 3, [greedy, unseeded, seeded])
    assert outputs[0].token_ids == expected[PROMPTS[0]][:16]
    drafts = {kind: [p for _, k, _, p in proposals if k == kind and len(p)] for kind in ("greedy", "unseeded", "seeded")}
    assert drafts["unseeded"] and all(p.parents is None and p.probs is not None and len(p) <= DEPTH for p in drafts["unseeded"])
    assert drafts["greedy"] and all(p.parents is not None for p in drafts["greedy"])
    assert drafts["seeded"] and all(p.parents is not None for p in drafts["seeded"])


def test_topk_wider_than_the_draft_vocabulary(target, head_dir) -> None:
    """The head's draft vocabulary (24 tokens here) bounds eagle_topk; the error names the field."""
    with pytest.raises(ConfigError, match="eagle_topk: 30 exceeds the head's draft vocabulary of 24 tokens"):
        LLM(target.model, _config(head_dir, eagle_topk=30, num_draft_tokens=None), tokenizer=target.tokenizer)


def test_adaptive_cuts_keep_trees_lossless(target, head_dir, expected) -> None:
    """With the adaptive draft length on, the engine may cut a tree to its first nodes; they are the
    best-scoring ones and still a tree, so greedy output is unchanged."""
    with LLM(target.model, _config(head_dir, adaptive_draft_len=True), tokenizer=target.tokenizer, max_batch_size=3) as llm:
        outputs = llm.generate([{"prompt_token_ids": target.encode(t)} for t in PROMPTS],
                               SamplingParams(max_tokens=32, ignore_eos=True))
        assert llm.get_metrics().num_drafts > 0, "the adaptive policy drafted nothing: the test would prove nothing"
    assert [o.token_ids for o in outputs] == [expected[t] for t in PROMPTS]


@pytest.mark.parametrize("wide_cost", [1.0, 5.0])
def test_adaptive_policy_keeps_the_tree_nodes_that_pay(target, head_dir, expected, monkeypatch, wide_cost: float) -> None:
    """The adaptive policy sizes a tree by its nodes' acceptance against the cost of each verify
    width. Where every width costs the same, every tree keeps all its nodes (or what the token
    budget leaves). Where forwards wider than the tree's depth cost 5 times a one-token forward,
    no tree goes past ``DEPTH`` nodes: at most ``DEPTH + 1`` tokens a step could pay for that
    width, while the first nodes cost nothing. The output is plain decoding's either way."""
    proposals, _ = _recording(monkeypatch)
    # The costs below stand: steps' measured times must not correct them toward this machine's.
    monkeypatch.setattr(StepTime, "correct", lambda self, cost: cost)
    prompt = target.encode(PROMPTS[0])
    with LLM(target.model, _config(head_dir, adaptive_draft_len=True), tokenizer=target.tokenizer, max_batch_size=1) as llm:
        step = ForwardCost([1.0] * (DEPTH + 1) + [wide_cost] * (NODES - DEPTH), base_seconds=1.0)
        llm.engine.policy.forward_costs[1] = ContextCost((128, 1024), (step, step))
        output = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=32, ignore_eos=True))[0]
    assert output.token_ids == expected[PROMPTS[0]]
    assert len(proposals) > 3
    for tokens, _, budget, proposal in proposals:
        left = 32 - (len(tokens) - len(prompt)) - 1
        if wide_cost == 1.0:
            assert budget == min(NODES, left)
        else:
            assert 0 < budget <= min(DEPTH, left)
        assert len(proposal) == budget
