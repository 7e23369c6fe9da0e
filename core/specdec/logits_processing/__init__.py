"""Logits processing under speculation: penalties, ``logit_bias``, ``min_tokens``, ``bad_words``,
grammar-constrained (structured) output and plugins' own processors.

Each verify row is processed as plain decoding processes the sequence that row follows, and
drafts a processor forbids outright are cut before the target forward, so speculative output
equals plain processed output (greedy exactly, sampled in distribution).
"""

from specdec.logits_processing.builder import LogitsProcessing
from specdec.logits_processing.grammar import Grammar, GrammarCompiler
from specdec.logits_processing.penalties import Penalties
from specdec.logits_processing.processor import LogitsProcessor, RequestProcessors
from specdec.logits_processing.rows import VerifyRows
from specdec.logits_processing.token_rules import BadWords, LogitBias, MinTokens

__all__ = [
    "BadWords", "Grammar", "GrammarCompiler", "LogitBias", "LogitsProcessing", "LogitsProcessor", "MinTokens",
    "Penalties", "RequestProcessors", "VerifyRows",
]
