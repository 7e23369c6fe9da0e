"""MTP passes the conformance suite with a tiny DeepSeek-V3 target whose checkpoint holds MTP layers
in DeepSeek-V3's layout: one layer in the main file (reused for the second draft, as vLLM does),
and three layers in a second shard named by ``model.safetensors.index.json``. The layers are
fitted to the target (see ``mtp_tiny``), so drafts are accepted often but not always. The same
with a tiny Llama target: MTP layers whose blocks are the target's own ``LlamaDecoderLayer``
(grouped-query attention), stored under DeepSeek-V3's names.
"""

from mtp_tiny import load_target

from specdec.testing.conformance import MethodConformance
from specdec.testing.tiny import shuffled_ranking
from specdec_mtp import MTPDecodingConfig


class TestMTPOneLayerConformance(MethodConformance):
    def make_target(self):
        return load_target(1)

    def make_config(self, target, tmp_path):
        return {"method": "deepseek_mtp", "num_speculative_tokens": 2}


class TestMTPThreeLayerConformance(MethodConformance):
    def make_target(self):
        return load_target(3)

    def make_config(self, target, tmp_path):
        return MTPDecodingConfig(max_draft_len=3)


class TestMTPLlamaConformance(MethodConformance):
    def make_target(self):
        return load_target(2, architecture="llama")

    def make_config(self, target, tmp_path):
        return MTPDecodingConfig(max_draft_len=3)


class TestMTPDraftVocabularyConformance(MethodConformance):
    """The Llama target's MTP layers drafting over 24 of its tokens (a shuffled ranking): the
    target's shared output layer is trimmed to the kept rows, and output stays the target's."""

    def make_target(self):
        return load_target(2, architecture="llama")

    def make_config(self, target, tmp_path):
        ranking = shuffled_ranking(target.model.config.vocab_size, tmp_path / "ranking.safetensors")
        return MTPDecodingConfig(max_draft_len=3, draft_vocab=str(ranking), draft_vocab_size=24)
