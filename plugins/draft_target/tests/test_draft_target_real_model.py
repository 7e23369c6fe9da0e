"""The shipped draft on the embedded default model (SmolLM2-135M-Instruct), float32: greedy output
equals plain greedy output on Spec-Bench prompts while drafts are accepted, alone and batched,
and sampled output follows the target's exact distribution."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)

pytestmark = pytest.mark.real_model

#: Fixed length: the adaptive policy may pause a draft that does not pay, leaving nothing to check.
CONFIG = {"method": "draft_model", "num_speculative_tokens": 4, "adaptive_draft_len": False}


GREEDY, SEEDED = SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)


@pytest.mark.parametrize(("options", "sampling"), [
    ({}, GREEDY), ({}, SEEDED), ({"confidence_threshold": 0.4}, GREEDY), ({"draft_vocab_size": 49152}, SEEDED),
    ({"parallel_drafting": False}, GREEDY),
], ids=["defaults-greedy", "defaults-seeded", "confidence-greedy", "full-vocabulary-seeded", "autoregressive-greedy"])
def test_shipped_draft_is_lossless(plain: LLM, options: dict, sampling: SamplingParams) -> None:
    """With the shipped draft's defaults (a PARD draft drafting in parallel, over the 8,192 tokens
    its replies use most), greedy and sampled with a seed; with chains cut at the draft's
    low-confidence tokens (``confidence_threshold``), over the full vocabulary, and drafting
    autoregressively, each in one of the two: plain decoding's output. (The options change how
    drafts are made, not how they are verified, so one decoding mode each covers them.)"""
    config = {**CONFIG, **options}
    expected, alone, batched = outputs_alone_and_batched(plain, config, ["writing", "coding"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_shipped_draft_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests (rejection sampling): three sampled tokens (top-k 2) match the exact
    joint distribution (chi-square). Seeded ones equal plain seeded decoding (above)."""
    p_value, accepted = sampled_distribution_p_value(plain, CONFIG, "The three primary colors are")
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
