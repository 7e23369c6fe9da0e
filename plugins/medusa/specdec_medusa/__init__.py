"""Medusa speculation for specdec: published heads (FasterDecoding, vLLM) drafting a static tree."""

from specdec_medusa.checkpoint import load_heads
from specdec_medusa.choices import MC_SIM_7B_63, expand_choices
from specdec_medusa.config import MedusaDecodingConfig
from specdec_medusa.heads import MedusaHeads

__all__ = ["MC_SIM_7B_63", "MedusaDecodingConfig", "MedusaHeads", "expand_choices", "load_heads"]
