"""The embedded default model for tests that check a claim on a real model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from specdec.bench.dataset import load_questions
from specdec.llm import LLM
from specdec.sampling import SamplingParams
from specdec.testing.conformance import chi_square_p_value, exact_joint_distribution


@pytest.fixture(scope="module")
def plain() -> Iterator[LLM]:
    """Fixture: plain float32 decoding on SmolLM2-135M-Instruct, loaded once per test module
    (which takes it by importing it from here), with every core for as long as it is in use."""
    yield from _plain("float32")


@pytest.fixture(scope="module")
def plain_bf16() -> Iterator[LLM]:
    """Fixture: :func:`plain` in bfloat16."""
    yield from _plain("bfloat16")


def _plain(dtype: str) -> Iterator[LLM]:
    """Test suites pin torch to one thread for their tiny models; a real model wants all of them,
    or its share of them when pytest-xdist runs several workers side by side."""
    threads = torch.get_num_threads()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    try:
        with LLM(None, None, dtype=dtype) as llm:
            yield llm
    finally:
        torch.set_num_threads(threads)


def sampled_distribution_p_value(plain: LLM, speculative_config: dict, prompt: str, samples: int = 120,
                                 tokens: int = 3, chat: bool = False) -> tuple[float, int]:
    """Sample ``tokens`` tokens (temperature 1, top-k 2) ``samples`` times with speculation,
    unseeded (rejection sampling, from torch's global generator, seeded here once), and compare
    them with the target's exact joint distribution by a chi-square test. ``chat`` wraps
    ``prompt`` as a user turn (a drafter trained on chat replies drafts well there).

    Seeded requests need no such test on the real model: their output is plain seeded decoding's
    token for token (each method's real-model tests check it), and the conformance suite tests
    their distribution on tiny models.

    Returns the p-value and the number of accepted draft tokens (a test should demand both a
    p-value above :data:`~specdec.testing.conformance.P_VALUE_FLOOR` and accepted drafts, or it
    proves nothing about verification).
    """
    ids = plain.encode(prompt, chat=chat)
    sampling = SamplingParams(temperature=1.0, top_k=2, max_tokens=tokens, ignore_eos=True)
    expected = exact_joint_distribution(plain.model, ids, sampling, tokens)
    observed: dict[tuple[int, ...], int] = {}
    torch.manual_seed(0)
    with LLM(plain.model, speculative_config, tokenizer=plain.tokenizer) as llm:
        for out in llm.generate([{"prompt_token_ids": ids}] * samples, sampling):  # decoded in batches
            observed[tuple(out.token_ids)] = observed.get(tuple(out.token_ids), 0) + 1
        accepted = llm.get_metrics().num_accepted_tokens
    return chi_square_p_value(observed, expected, samples), accepted


def outputs_alone_and_batched(plain: LLM, speculative_config: dict, categories: list[str], max_tokens: int = 32,
                              sampling: SamplingParams | None = None) -> tuple[list[list[int]], list[Any], list[Any]]:
    """Replies to the first Spec-Bench question of each category (greedy, or ``sampling``, which
    should then carry a seed): plain decoding's token ids, then the speculative outputs with each
    prompt decoded alone and all decoded together.

    A lossless method gives ``expected == [o.token_ids for o in alone] == [... batched]``; a test
    should also demand accepted drafts (``o.metrics.num_accepted_tokens``), or nothing was verified.
    """
    prompts = [q.turns[0] for q in load_questions("spec_bench", categories, per_category=1)]
    params = (sampling or SamplingParams()).model_copy(update={"max_tokens": max_tokens})
    expected = [plain.generate(p, params, chat=True)[0].token_ids for p in prompts]
    with LLM(plain.model, speculative_config, tokenizer=plain.tokenizer) as llm:
        alone = [llm.generate(p, params, chat=True)[0] for p in prompts]
        batched = llm.generate(prompts, params, chat=True)
    return expected, alone, batched
