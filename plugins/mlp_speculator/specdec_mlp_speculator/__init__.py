"""The MLP speculator (IBM, arXiv 2404.19124; vLLM's ``method: mlp_speculator``) for specdec."""

from specdec_mlp_speculator.config import MLPSpeculatorDecodingConfig
from specdec_mlp_speculator.speculator import (
    CompactSpeculator,
    MLPSpeculator,
    SpeculatorSpec,
    load_speculator,
    save_speculator,
)

__all__ = ["CompactSpeculator", "MLPSpeculator", "MLPSpeculatorDecodingConfig", "SpeculatorSpec", "load_speculator", "save_speculator"]
