"""Lookahead decoding on the embedded default model (SmolLM2-135M-Instruct), float32: greedy and
seeded output equal plain decoding's on Spec-Bench prompts, alone and batched, the window's
n-grams are accepted, and unseeded sampling (multi-candidate rejection sampling down the tree)
follows the target's distribution."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import (  # noqa: F401 (plain: a fixture)
    outputs_alone_and_batched,
    plain,
    sampled_distribution_p_value,
)

pytestmark = pytest.mark.real_model

#: Fixed shape: the adaptive policy may keep the window out on this CPU, leaving nothing to check.
CONFIG = {"decoding_type": "Lookahead", "adaptive_draft_len": False}


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
def test_lookahead_is_lossless(plain: LLM, sampling: SamplingParams) -> None:  # noqa: F811
    expected, alone, batched = outputs_alone_and_batched(plain, CONFIG, ["summarization", "coding"], max_tokens=48,
                                                         sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_lookahead_sampling_follows_target(plain: LLM) -> None:  # noqa: F811
    """Three sampled tokens (top-k 2) follow the exact joint distribution (chi-square), with the
    pool's n-grams (from a prompt that repeats itself) and the window's guesses verified as one
    tree by multi-candidate rejection sampling, and accepted along the way."""
    p_value, accepted = sampled_distribution_p_value(plain, CONFIG, "red, green, blue, red, green, blue, red, green,")
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
