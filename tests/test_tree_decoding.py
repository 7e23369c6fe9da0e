"""Draft trees through the engine: one target forward verifies every branch, the accepted path
may run through any branch, and the KV cache keeps only that path."""

from __future__ import annotations

import pytest

from specdec import LLM, DraftProposal, SamplingParams, UserProvidedDecodingConfig


class BranchingOracle:
    """A tree per request whose *second* root branch is the true continuation and whose first is
    wrong: greedy verification must take the second branch, so the accepted nodes are not a
    prefix of the flat layout and the cache must be compacted. Layout:
    0 wrong, 1 true[0], 2 true[1] (under 1), 3 wrong (under 0), 4 true[2] (under 2)."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.continuations, self.vocab = continuations, vocab

    def prepare_draft_tokens(self, requests, resource_manager):
        proposals = []
        for request in requests:
            full = self.continuations[tuple(request.token_ids[: request.num_prompt_tokens])]
            true = full[len(request.token_ids) : len(request.token_ids) + 3]
            if len(true) < 3:
                proposals.append(DraftProposal())
                continue
            wrong = (true[0] + 1) % self.vocab
            proposals.append(DraftProposal([wrong, true[0], true[1], wrong, true[2]], parents=[-1, -1, 1, 0, 2]))
        return proposals


@pytest.fixture(scope="module")
def cases(tiny):
    plain = LLM(tiny.model, None, tokenizer=tiny.tokenizer)
    prompts = [tiny.encode(t) for t in ("hello world, hello", "abc abd abe ab", "one two three, one")]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    outputs = [plain.generate({"prompt_token_ids": ids}, params)[0].token_ids for ids in prompts]
    return prompts, outputs, params


@pytest.mark.parametrize("max_batch_size", [1, 3])
def test_tree_drafts_are_lossless_and_take_the_right_branch(tiny, cases, max_batch_size):
    """Alone and in a batch, greedy output equals plain greedy; every drafting step accepts the
    true nodes through the second branch (all three unless the step's budget cut the tree)."""
    prompts, outputs, params = cases
    oracle = BranchingOracle({tuple(p): p + o for p, o in zip(prompts, outputs)}, tiny.model.config.vocab_size)
    config = UserProvidedDecodingConfig(drafter=oracle, max_draft_len=5, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer, max_batch_size=max_batch_size) as llm:
        got = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    assert [g.token_ids for g in got] == outputs
    for g in got:
        per_pos = g.metrics.num_accepted_tokens_per_pos
        assert g.metrics.num_drafts > 0 and per_pos[0] == per_pos[1] == g.metrics.num_drafts
        assert per_pos[2] >= g.metrics.num_drafts - 1
        assert len(per_pos) == 3, "one per-position count per tree level (depth 3), not per node (5)"


def test_unseeded_sampled_trees_take_the_right_branch(tiny, cases):
    """A sampled request without a seed verifies its tree of deterministic drafts by
    multi-candidate rejection sampling: with top-k 1 the target's distribution is its argmax, so
    the output is plain greedy decoding's and the second, true branch is accepted after the first
    is rejected (the sampled distribution itself is tested in test_verify.py and by every tree
    method's conformance suite)."""
    prompts, outputs, _ = cases
    oracle = BranchingOracle({tuple(p): p + o for p, o in zip(prompts, outputs)}, tiny.model.config.vocab_size)
    config = UserProvidedDecodingConfig(drafter=oracle, max_draft_len=5, adaptive_draft_len=False)
    params = SamplingParams(temperature=1.0, top_k=1, max_tokens=30, ignore_eos=True)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [g.token_ids for g in got] == outputs
    assert all(g.metrics.num_accepted_tokens >= 3 * (g.metrics.num_drafts - 1) for g in got)


def test_seeded_sampled_trees_give_the_plain_seeded_output(tiny, cases):
    """A seeded sampled request's tree keeps the path of the target's own draws: the output is
    plain seeded decoding's, and the true branch is accepted."""
    prompts, _, _ = cases
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=30, ignore_eos=True, seed=7)
    expected = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate({"prompt_token_ids": prompts[0]}, params)[0].token_ids
    oracle = BranchingOracle({tuple(prompts[0]): prompts[0] + expected}, tiny.model.config.vocab_size)
    config = UserProvidedDecodingConfig(drafter=oracle, max_draft_len=5, adaptive_draft_len=False)
    with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
        got = llm.generate({"prompt_token_ids": prompts[0]}, params)[0]
    assert got.token_ids == expected
    assert got.metrics.num_accepted_tokens >= 2 * got.metrics.num_drafts > 0
