"""ReDrafter on the embedded default model (SmolLM2-135M-Instruct), float32.

The shipped drafter (trained for this target, used when no ``speculative_model`` is given, a
compact drafter over the shipped draft vocabulary) drafts beam trees that keep greedy and seeded
output exactly plain decoding's, alone and batched, while its drafts are accepted, also past the
first depth; unseeded sampled output follows the target's exact distribution. A drafter in
Apple's layout with random weights keeps output exact too.
"""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)
from specdec_redrafter import DrafterSpec, RecurrentDrafter, save_drafter

pytestmark = pytest.mark.real_model

PROMPTS = ["Name three primary colors.", "Write one sentence about the sea."]
SHIPPED = {"method": "redrafter", "adaptive_draft_len": False, "redrafter_num_beams": 3, "max_draft_len": 3}


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
def test_shipped_drafter_is_lossless(plain: LLM, sampling: SamplingParams) -> None:  # noqa: F811
    expected, alone, batched = outputs_alone_and_batched(plain, SHIPPED, ["writing", "math"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0
    if sampling.greedy:  # the recurrent state drafts well past the first depth too
        assert sum(sum(o.metrics.num_accepted_tokens_per_pos[1:]) for o in alone) > 0


def test_shipped_drafter_sampling_follows_target(plain: LLM) -> None:  # noqa: F811
    """Unseeded requests go through the core's multi-candidate rejection sampling over the beams'
    tree: the reply's first three sampled tokens (top-k 2) match the exact joint distribution
    (chi-square)."""
    p_value, accepted = sampled_distribution_p_value(plain, SHIPPED, "Write a haiku about the sea.", chat=True)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR


def test_untrained_drafter_keeps_output_on_the_default_model(plain: LLM, tmp_path) -> None:  # noqa: F811
    config = plain.model.config
    torch.manual_seed(0)
    drafter = RecurrentDrafter(DrafterSpec(config.hidden_size, config.vocab_size, 2 * config.hidden_size, 1, True))
    directory = save_drafter(drafter, tmp_path / "drafter")
    method = {"decoding_type": "ReDrafter", "model": str(directory), "adaptive_draft_len": False,
              "redrafter_num_beams": 3, "redrafter_draft_len_per_beam": 3}
    greedy, seeded = SamplingParams(max_tokens=24), SamplingParams(temperature=0.7, top_p=0.95, seed=0, max_tokens=24)
    with LLM(plain.model, method, tokenizer=plain.tokenizer) as llm:
        for params in (greedy, seeded):
            expected = [o.token_ids for o in plain.generate(PROMPTS, params, chat=True)]
            alone = [llm.generate(p, params, chat=True)[0] for p in PROMPTS]
            batched = llm.generate(PROMPTS, params, chat=True)
            assert [o.token_ids for o in alone] == expected
            assert [o.token_ids for o in batched] == expected
            assert sum(o.metrics.num_draft_tokens for o in alone) > 0
