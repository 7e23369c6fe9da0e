"""Lookahead decoding passes the conformance suite: TensorRT-LLM's default sizes, a wide window
of long n-grams, and the smallest shape (bigrams, one column)."""

from specdec.testing.conformance import MethodConformance
from specdec_lookahead import LookaheadDecodingConfig


class TestLookaheadConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return LookaheadDecodingConfig()


class TestLookaheadWideConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"decoding_type": "Lookahead", "max_window_size": 6, "max_ngram_size": 5, "max_verification_set_size": 3}


class TestLookaheadBigramConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"method": "lookahead", "max_window_size": 1, "max_ngram_size": 2, "max_verification_set_size": 1}
