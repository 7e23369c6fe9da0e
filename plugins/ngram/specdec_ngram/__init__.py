"""N-gram (prompt lookup) speculation for specdec."""

from specdec_ngram.config import NGramDecodingConfig
from specdec_ngram.pool import NGramPool

__all__ = ["NGramDecodingConfig", "NGramPool"]
