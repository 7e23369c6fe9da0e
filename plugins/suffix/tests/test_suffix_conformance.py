"""Suffix decoding passes the conformance suite with tree drafts (the default), chains, and no
global cache."""

from specdec.testing.conformance import MethodConformance
from specdec_suffix import SuffixDecodingConfig


class TestSuffixTreeConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return SuffixDecodingConfig(max_draft_len=6, suffix_decoding_min_token_prob=0.0)


class TestSuffixChainConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_tree_spec": False,
                "suffix_decoding_max_spec_factor": 2.0}


class TestSuffixLocalOnlyConformance(MethodConformance):
    def make_config(self, target, tmp_path):
        return {"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_cached_requests": 0}
