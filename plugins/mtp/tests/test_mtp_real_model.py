"""MTP on the embedded default model (SmolLM2-135M-Instruct, a Llama-style target with no MTP
layers of its own), float32.

The shipped layer (trained for this target, used when no ``speculative_model`` is given), reused
for three draft tokens a step as vLLM reuses the last layer, keeps greedy output exact, alone
and batched, while its drafts are accepted, also past the first depth; a seeded request's output
is plain seeded decoding's; unseeded sampled output follows the target's exact distribution.
"""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)

pytestmark = pytest.mark.real_model

CONFIG = {"method": "mtp", "max_draft_len": 3, "adaptive_draft_len": False}


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
def test_shipped_layer_is_lossless(plain: LLM, sampling: SamplingParams) -> None:
    expected, alone, batched = outputs_alone_and_batched(plain, CONFIG, ["writing", "math"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0
    if sampling.greedy:  # depths 2 and 3 reuse the layer on its own outputs, and it drafts well there too
        assert sum(sum(o.metrics.num_accepted_tokens_per_pos[1:2]) for o in alone) > 0


def test_shipped_layer_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests (rejection sampling): the reply's first three sampled tokens (top-k 2)
    match the exact joint distribution (chi-square). Seeded ones equal plain seeded decoding
    (above)."""
    p_value, accepted = sampled_distribution_p_value(plain, CONFIG, "Write a haiku about the sea.", chat=True)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
