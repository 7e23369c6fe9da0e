"""ReDrafter on the embedded default model (SmolLM2-135M-Instruct), float32: a drafter in Apple's
layout with random weights (none is trained for this target yet) drafts beam trees that leave
greedy and seeded output exactly plain decoding's, alone and batched."""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams
from specdec.testing.real_model import plain  # noqa: F401 (plain: a fixture)
from specdec_redrafter import DrafterSpec, RecurrentDrafter, save_drafter

pytestmark = pytest.mark.real_model

PROMPTS = ["Name three primary colors.", "Write one sentence about the sea."]


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
