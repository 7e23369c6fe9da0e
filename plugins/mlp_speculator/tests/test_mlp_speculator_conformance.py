"""The MLP speculator passes the conformance suite, loaded from IBM's layout: trees for greedy and
seeded requests, chains by rejection sampling for sampled ones, and a chain-only speculator with
tied weights. The stages are fitted to the suite's tiny target (``mlp_tiny``), so drafts are
accepted often but not always."""

from mlp_tiny import fitted_speculator

from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec_mlp_speculator import MLPSpeculatorDecodingConfig, save_speculator


class TestMLPSpeculatorTreeConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        directory = save_speculator(fitted_speculator(target.model), tmp_path / "speculator")
        return MLPSpeculatorDecodingConfig(speculative_model=str(directory), num_speculative_tokens=3, num_draft_tokens=6)


class TestMLPSpeculatorTiedChainConformance(MethodConformance):
    """vLLM's dict, tied stages and a chain (top_k_tokens_per_head all 1)."""

    def make_config(self, target, tmp_path):
        speculator = fitted_speculator(target.model, tie_weights=True, scale_input=False, top_k=[1, 1, 1])
        directory = save_speculator(speculator, tmp_path / "speculator")
        return {"method": "mlp_speculator", "model": str(directory), "num_speculative_tokens": 3}


class TestMLPSpeculatorDraftVocabularyConformance(MethodConformance):
    """A draft vocabulary of 24 of the 36 tokens, in a shuffled ranking: every stage scores the kept
    tokens only (trees and sampled chains), and output stays the target's."""

    def make_config(self, target, tmp_path):
        directory = save_speculator(fitted_speculator(target.model), tmp_path / "speculator")
        ranking = shuffled_ranking(target.model.config.vocab_size, tmp_path / "ranking.safetensors")
        return MLPSpeculatorDecodingConfig(speculative_model=str(directory), num_draft_tokens=6,
                                           draft_vocab=str(ranking), draft_vocab_size=24)
