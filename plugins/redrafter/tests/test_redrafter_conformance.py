"""ReDrafter passes the conformance suite with drafters in Apple's layout fitted to the tiny
target: a recurrent drafter of Apple's trainer's shape (exit_dim 2H), a running-sum one with a
narrower MLP behind an input projection, and the first drafting over a draft vocabulary."""

from redrafter_tiny import fitted_drafter

from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec_redrafter import ReDrafterDecodingConfig, save_drafter


class TestReDrafterConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        directory = save_drafter(fitted_drafter(target.model), tmp_path / "drafter")
        return ReDrafterDecodingConfig(speculative_model=str(directory), redrafter_num_beams=4, max_draft_len=3)


class TestReDrafterSumConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        drafter = fitted_drafter(target.model, rnn=False, exit_dim=48, layers=2)
        directory = save_drafter(drafter, tmp_path / "drafter")
        return {"decoding_type": "ReDrafter", "speculative_model_dir": str(directory), "redrafter_num_beams": 3,
                "redrafter_draft_len_per_beam": 2}


class TestReDrafterDraftVocabularyConformance(MethodConformance):
    """The beams drafted among 24 of the 36 tokens (a shuffled ranking): the output layer keeps
    their rows only, and output stays the target's."""

    def make_config(self, target, tmp_path):
        directory = save_drafter(fitted_drafter(target.model), tmp_path / "drafter")
        ranking = shuffled_ranking(target.model.config.vocab_size, tmp_path / "ranking.safetensors")
        return ReDrafterDecodingConfig(speculative_model=str(directory), redrafter_num_beams=4, max_draft_len=3,
                                       draft_vocab=str(ranking), draft_vocab_size=24)
