"""Suffix trees over token sequences, the cache of them suffix decoding drafts from, and suffix
drafts over any method (``use_sa_spec``)."""

from specdec.suffix.cache import SuffixCache
from specdec.suffix.overlay import SuffixDrafts
from specdec.suffix.tree import Draft, SuffixTree

__all__ = ["Draft", "SuffixCache", "SuffixDrafts", "SuffixTree"]
