"""Lookahead decoding passes the conformance suite: TensorRT-LLM's default sizes and the smallest
shape (bigrams, one column: the window is full from the first step). Deeper windows are checked
row by row against the target in test_window.py."""

from specdec.testing.conformance import MethodConformance
from specdec_lookahead import LookaheadDecodingConfig


class TestLookaheadConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return LookaheadDecodingConfig()


class TestLookaheadBigramConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"method": "lookahead", "max_window_size": 1, "max_ngram_size": 2, "max_verification_set_size": 1}
