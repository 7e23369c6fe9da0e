"""Suffix decoding on the embedded default model (SmolLM2-135M-Instruct), float32: greedy and
seeded output equal plain decoding's on Spec-Bench prompts, alone and batched, and unseeded
sampling's distribution is the target's, all with tree drafts."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)

pytestmark = pytest.mark.real_model

#: Fixed length: the adaptive policy may pause a drafter that does not pay, leaving nothing to check.
CONFIG = {"method": "suffix", "num_speculative_tokens": 8, "adaptive_draft_len": False}


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
def test_suffix_is_lossless(plain: LLM, sampling: SamplingParams) -> None:
    expected, alone, batched = outputs_alone_and_batched(plain, CONFIG, ["summarization", "coding"], max_tokens=48,
                                                         sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_suffix_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests draft trees from the earlier samples' outputs (the global tree), and
    three sampled tokens (top-k 2) follow the exact joint distribution (chi-square)."""
    p_value, accepted = sampled_distribution_p_value(plain, {**CONFIG, "num_speculative_tokens": 2},
                                                     "The three primary colors are")
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
