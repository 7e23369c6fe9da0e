"""The MLP speculator on the embedded default model (SmolLM2-135M-Instruct), float32.

The shipped speculator (trained for this target, used when no ``speculative_model`` is given,
drafting over the shipped draft vocabulary) keeps greedy and seeded output exactly plain
decoding's, alone and batched, while its drafts are accepted, also past the first stage;
unseeded sampled output follows the target's exact distribution. A speculator in IBM's layout
with random stages keeps output exact too.
"""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing.conformance import P_VALUE_FLOOR
from specdec.testing.real_model import outputs_alone_and_batched, plain, sampled_distribution_p_value  # noqa: F401 (plain: a fixture)
from specdec_mlp_speculator import MLPSpeculator, SpeculatorSpec, save_speculator

pytestmark = pytest.mark.real_model

PROMPTS = ["Name three primary colors.", "Write one sentence about the sea."]
SHIPPED = {"method": "mlp_speculator", "adaptive_draft_len": False}


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.95, seed=0)],
                         ids=["greedy", "seeded"])
def test_shipped_speculator_is_lossless(plain: LLM, sampling: SamplingParams) -> None:
    expected, alone, batched = outputs_alone_and_batched(plain, SHIPPED, ["writing", "math"], sampling=sampling)
    assert [o.token_ids for o in alone] == expected
    assert [o.token_ids for o in batched] == expected
    assert sum(o.metrics.num_accepted_tokens for o in alone) > 0
    if sampling.greedy:  # stages 1 and 2 draft well too
        assert sum(sum(o.metrics.num_accepted_tokens_per_pos[1:]) for o in alone) > 0


def test_shipped_speculator_sampling_follows_target(plain: LLM) -> None:
    """Unseeded requests draft chains (rejection sampling): the reply's first three sampled tokens
    (top-k 2) match the exact joint distribution (chi-square)."""
    p_value, accepted = sampled_distribution_p_value(plain, SHIPPED, "Write a haiku about the sea.", chat=True)
    assert accepted > 0
    assert p_value > P_VALUE_FLOOR


def test_untrained_speculator_keeps_output_on_the_default_model(plain: LLM, tmp_path) -> None:
    config = plain.model.config
    torch.manual_seed(0)
    speculator = MLPSpeculator(SpeculatorSpec(config.hidden_size, 64, 3, config.vocab_size, True, True, [3, 2, 1]))
    speculator.reset_parameters()
    directory = save_speculator(speculator, tmp_path / "speculator")
    method = {"method": "mlp_speculator", "model": str(directory), "adaptive_draft_len": False, "num_draft_tokens": 6}
    greedy, seeded = SamplingParams(max_tokens=24), SamplingParams(temperature=0.7, top_p=0.95, seed=0, max_tokens=24)
    with LLM(plain.model, method, tokenizer=plain.tokenizer) as llm:
        for params in (greedy, seeded):
            expected = [o.token_ids for o in plain.generate(PROMPTS, params, chat=True)]
            alone = [llm.generate(p, params, chat=True)[0] for p in PROMPTS]
            batched = llm.generate(PROMPTS, params, chat=True)
            assert [o.token_ids for o in alone] == expected
            assert [o.token_ids for o in batched] == expected
            assert sum(o.metrics.num_draft_tokens for o in alone) > 0
