"""A drafting or accepting call for the whole batch that raises part-way, after some requests'
head state changed (their pending features run into the head cache, drafts chained into it, new
features queued), is retried by the engine for each request alone: every request goes on, and
drafts from then on exactly as if the call had never failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from eagle3_tiny import fitted_head

from specdec import LLM, SamplingParams
from specdec.testing import make_tiny_target
from specdec_eagle3 import save_head
from specdec_eagle3.drafter import Eagle3Resources

PROMPTS = ("the cat sat on the mat. the cat", "hello world, hello", "one two three, one two")
#: The step whose call fails, for the batch's second request: the first one's state has changed.
FAILING_STEP = 2
CHAIN = {"num_speculative_tokens": 3}
TREE = {"num_speculative_tokens": 3, "eagle_topk": 3, "num_draft_tokens": 8}


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(seed=0)


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory) -> Path:
    return save_head(fitted_head(target.model, (0, 1)), tmp_path_factory.mktemp("fitted"), "speculators")


def run(target, head_dir: Path, options: dict, fail: str | None = None) -> tuple[list, dict[tuple[int, int], list[int]], list]:
    """The outputs of the prompts decoded as one batch; every proposal the head returned, by
    (request, tokens so far); and the drafting proposals after which a request's head cache did not
    hold exactly its true pairs, as (request, cached, true pairs).

    ``fail`` names a method of :class:`Eagle3Resources` that raises once at step ``FAILING_STEP``:
    ``commit`` in the batch's second request, before it queues anything; ``_choose`` and
    ``_logprobs`` (a chain's and a tree's) at their second call of the batch's drafting call, after
    every request's head cache took its pending pairs and a first draft step ran."""
    llm = LLM(target.model, {"method": "eagle3", "model": str(head_dir), "adaptive_draft_len": False, **options},
              tokenizer=target.tokenizer)
    manager: Eagle3Resources = llm.engine.resource_manager
    proposals: dict[tuple[int, int], list[int]] = {}
    out_of_step: list[tuple[int, int, int]] = []
    counts = {"propose": 0, "commit": 0, "inner": 0}
    propose, commit = manager.propose, manager.commit
    # Counted from 1: one drafting call per step, one accept per request and step.
    failing = {"propose": FAILING_STEP + 1, "commit": len(PROMPTS) * FAILING_STEP + 2}

    def recording_propose(requests):
        counts["propose"] += 1
        counts["inner"] = 0
        drafted = propose(requests)
        for request, proposal in zip(requests, drafted):
            proposals[request.request_id, len(request.token_ids)] = list(proposal.token_ids)
            if proposal.token_ids and request.method_state.cache.length != len(request.token_ids) - 1:
                out_of_step.append((request.request_id, request.method_state.cache.length, len(request.token_ids) - 1))
        return drafted

    def failing_commit(request, result):
        counts["commit"] += 1
        if fail == "commit" and counts["commit"] == failing["commit"]:
            raise RuntimeError("injected failure")
        commit(request, result)

    manager.propose, manager.commit = recording_propose, failing_commit
    if fail in ("_choose", "_logprobs"):
        inner = getattr(manager, fail)

        def failing_inner(*args):
            counts["inner"] += 1
            if counts["propose"] == failing["propose"] and counts["inner"] == 2:
                raise RuntimeError("injected failure")
            return inner(*args)

        setattr(manager, fail, failing_inner)
    try:
        outputs = llm.generate([{"prompt_token_ids": target.encode(p)} for p in PROMPTS],
                               SamplingParams(max_tokens=24, ignore_eos=True))
    finally:
        llm.close()
    if fail is not None:
        counted = "commit" if fail == "commit" else "propose"
        assert counts[counted] > failing[counted], "the injected failure never happened"
    return outputs, proposals, out_of_step


@pytest.mark.parametrize(
    ("options", "fail"),
    [(CHAIN, "_choose"), (TREE, "_logprobs"), (CHAIN, "commit"), (TREE, "commit")],
    ids=["chain-draft", "tree-draft", "chain-accept", "tree-accept"],
)
def test_a_retried_call_drafts_as_if_it_never_failed(target, head_dir: Path, options: dict, fail: str) -> None:
    """Each request's greedy output is its plain output, none ends with an error, the head cache
    holds exactly the true pairs after every proposal, and every proposal (the retried ones
    included) and acceptance count equal those of a run without the failure."""
    plain = LLM(target.model, None, tokenizer=target.tokenizer)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    expected = [plain.generate({"prompt_token_ids": target.encode(p)}, params)[0].token_ids for p in PROMPTS]
    clean, clean_proposals, _ = run(target, head_dir, options)
    failed, failed_proposals, out_of_step = run(target, head_dir, options, fail)
    assert [out.token_ids for out in clean] == expected
    assert [(out.finish_reason, out.error) for out in failed] == [("length", None)] * len(PROMPTS)
    assert [out.token_ids for out in failed] == expected
    assert out_of_step == []
    assert sum(out.metrics.num_accepted_tokens for out in clean) > 0
    assert failed_proposals == clean_proposals
    for got, want in zip(failed, clean):
        assert (got.metrics.num_drafts, got.metrics.num_accepted_tokens, got.metrics.num_accepted_tokens_per_pos) == (
            want.metrics.num_drafts, want.metrics.num_accepted_tokens, want.metrics.num_accepted_tokens_per_pos)
