"""Helpers for testing specdec methods: tiny in-process models and the conformance suite."""

from specdec.testing.tiny import TinyTarget, make_tiny_target, tiny_tokenizer

__all__ = ["TinyTarget", "make_tiny_target", "tiny_tokenizer"]
