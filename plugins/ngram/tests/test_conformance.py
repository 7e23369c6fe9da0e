"""The n-gram method passes the conformance suite, per-request pool and public pool alike."""

from specdec.testing.conformance import MethodConformance
from specdec_ngram import NGramDecodingConfig


class TestNGramConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return NGramDecodingConfig(max_draft_len=4)


class TestNGramPublicPoolConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "is_public_pool": True}
