"""EAGLE-3 passes the conformance suite with a head loaded from each published layout.

The head is fitted to the suite's tiny target (see ``eagle3_tiny``), so drafts are accepted
often but not always, and it drafts from a compressed vocabulary mapped through ``d2t``. The tiny
target has 2 layers, too few for the default {2, L//2, L-3}; the fused layers come from the
config option in one class and from the checkpoint's record in the others. The tree class
spells its options as SGLang does.
"""

from eagle3_tiny import fitted_head

from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec_eagle3 import Eagle3DecodingConfig, save_head


class TestEagle3SafeAILabConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        head = fitted_head(target.model, (0, 1), record_layers=False)
        save_head(head, tmp_path / "head", "safeailab", weights_format="bin")
        return Eagle3DecodingConfig(speculative_model=str(tmp_path / "head"), max_draft_len=3, eagle3_layers_to_capture=[1, 0])


class TestEagle3SpeculatorsConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        head = fitted_head(target.model, (0, 1))
        save_head(head, tmp_path / "head", "speculators")
        return {"method": "eagle3", "model": str(tmp_path / "head"), "num_speculative_tokens": 4}


class TestEagle3TreeConformance(MethodConformance):
    """Tree options on: greedy requests verify EAGLE-2 trees, sampled requests chains of max_draft_len."""

    def make_config(self, target, tmp_path):
        head = fitted_head(target.model, (0, 1))
        save_head(head, tmp_path / "head", "safeailab")
        return {"decoding_type": "Eagle3", "speculative_model": str(tmp_path / "head"), "speculative_num_steps": 3,
                "speculative_eagle_topk": 3, "speculative_num_draft_tokens": 9}


class TestEagle3DraftVocabularyConformance(MethodConformance):
    """A draft vocabulary over the head's own (d2t, 24 tokens): the 16 of them a shuffled ranking
    puts first, for chains and EAGLE-2 trees; output stays the target's."""

    def make_config(self, target, tmp_path):
        head = fitted_head(target.model, (0, 1))
        save_head(head, tmp_path / "head", "safeailab")
        ranking = shuffled_ranking(target.model.config.vocab_size, tmp_path / "ranking.safetensors")
        return {"decoding_type": "Eagle3", "speculative_model": str(tmp_path / "head"), "speculative_num_steps": 3,
                "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6, "draft_vocab": str(ranking),
                "draft_vocab_size": 16}
