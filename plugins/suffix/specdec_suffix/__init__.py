"""Suffix decoding (SuffixDecoding, arXiv 2411.04975; vLLM's ``method: suffix``) for specdec.

The trees and their cache are the core's (``specdec.SuffixCache``), shared with ``use_sa_spec``."""

from specdec_suffix.config import SuffixDecodingConfig

__all__ = ["SuffixDecodingConfig"]
