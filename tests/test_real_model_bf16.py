"""Batch invariance on the embedded default model in bfloat16 (issue 48): where the CPU has
oneDNN's bfloat16 kernels, greedy speculative output with every chain-drafting method is plain
bfloat16 decoding's token for token, alone and batched, and so is a seeded request's; a request
gets the same text alone and among others.
"""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.bench.dataset import load_questions
from specdec.testing import needs_prepacked_linears
from specdec.testing.real_model import plain_bf16  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.real_model, needs_prepacked_linears]

#: Spec-Bench prompts whose answers the shipped drafters and n-gram lookup draft well.
PROMPTS = [q.turns[0] for q in load_questions("spec_bench", ["coding", "summarization", "roleplay"], per_category=1)]
GREEDY = [SamplingParams(max_tokens=n) for n in (40, 32, 48)]


@pytest.fixture(scope="module")
def expected(plain_bf16: LLM) -> list[list[int]]:
    """Each prompt's plain bfloat16 greedy output, decoded alone."""
    return [plain_bf16.generate(p, sp, chat=True)[0].token_ids for p, sp in zip(PROMPTS, GREEDY)]


def test_plain_decoding_gives_a_request_the_same_tokens_alone_and_batched(plain_bf16: LLM, expected) -> None:
    outputs = plain_bf16.generate(PROMPTS, GREEDY, chat=True)
    assert [o.token_ids for o in outputs] == expected


@pytest.mark.parametrize("method", ["ngram", "eagle3", "mtp", "draft_target"])
def test_greedy_speculation_is_plain_bf16_decoding_token_for_token(plain_bf16: LLM, expected, method: str) -> None:
    """Each method drafts chains of 3 (fixed, so that drafts are verified whatever this CPU's
    costs); alone and in a batch of three, the output is plain decoding's, and drafts were kept."""
    config = {"method": method, "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain_bf16.model, config, tokenizer=plain_bf16.tokenizer) as llm:
        alone = [llm.generate(p, sp, chat=True)[0] for p, sp in zip(PROMPTS, GREEDY)]
        batched = llm.generate(PROMPTS, GREEDY, chat=True)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_seeded_speculation_is_plain_seeded_bf16_decoding(plain_bf16: LLM) -> None:
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=40)
    want = plain_bf16.generate(PROMPTS[0], seeded, chat=True)[0].token_ids
    config = {"method": "ngram", "num_speculative_tokens": 3, "adaptive_draft_len": False}
    with LLM(plain_bf16.model, config, tokenizer=plain_bf16.tokenizer) as llm:
        assert llm.generate(PROMPTS[0], seeded, chat=True)[0].token_ids == want
        assert llm.generate(PROMPTS, [seeded, *GREEDY[1:]], chat=True)[0].token_ids == want
