"""Suffix decoding (SuffixDecoding, arXiv 2411.04975; vLLM's ``method: suffix``) for specdec."""

from specdec_suffix.cache import SuffixCache
from specdec_suffix.config import SuffixDecodingConfig
from specdec_suffix.tree import SuffixTree

__all__ = ["SuffixCache", "SuffixDecodingConfig", "SuffixTree"]
