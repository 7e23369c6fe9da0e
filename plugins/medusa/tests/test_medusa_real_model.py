"""Medusa on the embedded default model (SmolLM2-135M-Instruct), float32.

The shipped heads (trained for this target with a shared lm_head, used when no
``speculative_model`` is given) keep greedy output exact, alone and batched, for the default
tree and for a chain, while their drafts are accepted; a seeded request's output is plain seeded
decoding's; unseeded sampled output follows the target's exact distribution (the chain and
rejection sampling an unseeded request takes).
"""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("tree", [{}, {"medusa_choices": [[0], [0, 0], [0, 0, 0]]}], ids=["tree", "chain"])
def test_shipped_heads_are_lossless(plain: LLM, tree: dict, sampling: SamplingParams) -> None:
    config = {"method": "medusa", "adaptive_draft_len": False, **tree}
    expected, alone, batched = outputs_alone_and_batched(plain, config, ["math", "roleplay"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0


def test_shipped_heads_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests (a chain, rejection sampling): the reply's first three sampled tokens
    (top-k 2) match the exact joint distribution (chi-square). Seeded ones equal plain seeded
    decoding, for trees and chains (above). A prompt whose reply the heads draft for from its
    second token on (for "Name the three primary colors." they never get a draft accepted that
    early)."""
    config = {"method": "medusa", "adaptive_draft_len": False}
    p_value, accepted = sampled_distribution_p_value(plain, config, "Write a haiku about the sea.", chat=True)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR
