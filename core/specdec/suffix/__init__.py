"""Suffix trees over token sequences, the cache of them suffix decoding drafts from, and suffix
drafts over any method (``use_sa_spec``)."""

from specdec.suffix.cache import SUFFIX_DEFAULTS, SuffixCache, SuffixDefaults
from specdec.suffix.overlay import SuffixDrafts
from specdec.suffix.tree import Draft, SuffixTree

__all__ = ["SUFFIX_DEFAULTS", "Draft", "SuffixCache", "SuffixDefaults", "SuffixDrafts", "SuffixTree"]
