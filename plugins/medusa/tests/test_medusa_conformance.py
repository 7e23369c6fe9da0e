"""Medusa passes the conformance suite with heads loaded from each published layout.

The heads are fitted to the suite's tiny target (see ``medusa_tiny``), so drafts are accepted
often but not always. Greedy and seeded requests verify trees; unseeded sampled requests verify
chains by rejection sampling, which the suite's chi-square test checks.
"""

import torch
from medusa_tiny import fitted_heads, save_fasterdecoding, save_vllm

from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec_medusa import MedusaDecodingConfig


class TestMedusaFasterDecodingConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        directory = save_fasterdecoding(fitted_heads(target.model), tmp_path / "heads", weights_format="pt")
        return MedusaDecodingConfig(speculative_model=str(directory), medusa_choices=[[0, 0, 0], [0, 1], [1, 0], [2]])


class TestMedusaVllmConformance(MethodConformance):
    """vLLM's dict and layout, a truncated head vocabulary and the default tree (mc_sim_7b_63 cut to 3 heads)."""

    def make_config(self, target, tmp_path):
        token_map = torch.arange(target.model.config.vocab_size)[3:]
        directory = save_vllm(fitted_heads(target.model), tmp_path / "heads", token_map=token_map)
        return {"method": "medusa", "model": str(directory)}


class TestMedusaDraftVocabularyConformance(MethodConformance):
    """A draft vocabulary of 24 of the 36 tokens, in a shuffled ranking: every head projects onto
    the kept rows only, and output stays the target's (greedy exact, sampled chi-square); tokens
    outside the kept set come from the verify step alone."""

    def make_config(self, target, tmp_path):
        directory = save_fasterdecoding(fitted_heads(target.model), tmp_path / "heads", weights_format="pt")
        ranking = shuffled_ranking(target.model.config.vocab_size, tmp_path / "ranking.safetensors")
        return MedusaDecodingConfig(speculative_model=str(directory), medusa_choices=[[0, 0, 0], [0, 1], [1, 0], [2]],
                                    draft_vocab=str(ranking), draft_vocab_size=24)
