"""EAGLE-3 speculation for specdec: published heads (SafeAILab, vLLM speculators) drafting from target states."""

from specdec_eagle3.checkpoint import LAYOUTS, load_head, save_head
from specdec_eagle3.config import Eagle3DecodingConfig
from specdec_eagle3.head import Eagle3Head, Eagle3HeadConfig, HeadCache

__all__ = ["LAYOUTS", "Eagle3DecodingConfig", "Eagle3Head", "Eagle3HeadConfig", "HeadCache", "load_head", "save_head"]
