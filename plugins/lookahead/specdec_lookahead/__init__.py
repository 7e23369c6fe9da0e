"""Lookahead decoding (Fu et al., "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", arXiv 2402.02057; TensorRT-LLM's ``decoding_type: Lookahead``) for specdec."""

from specdec_lookahead.config import LookaheadDecodingConfig

__all__ = ["LookaheadDecodingConfig"]
