"""Helpers for testing specdec methods: tiny in-process models and the conformance suite."""

from specdec.testing.caches import prefilled_batch
from specdec.testing.device import DEVICE_ENV, device_under_test
from specdec.testing.hf_peer import hf_peer_kwargs
from specdec.testing.markers import needs_prepacked_linears
from specdec.testing.tiny import TWO_TURNS, PadDrafter, TinyTarget, make_tiny_target, tiny_tokenizer

__all__ = ["DEVICE_ENV", "TWO_TURNS", "PadDrafter", "TinyTarget", "device_under_test", "hf_peer_kwargs", "make_tiny_target", "needs_prepacked_linears",
           "prefilled_batch", "tiny_tokenizer"]
