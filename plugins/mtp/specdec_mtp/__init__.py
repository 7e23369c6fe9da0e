"""MTP speculation for specdec: DeepSeek-V3 multi-token prediction layers drafting from target states."""

from specdec_mtp.checkpoint import load_mtp_layers, mtp_layer_tensors, mtp_tensor_names
from specdec_mtp.config import MTPDecodingConfig
from specdec_mtp.layer import MTPLayer

__all__ = ["MTPDecodingConfig", "MTPLayer", "load_mtp_layers", "mtp_layer_tensors", "mtp_tensor_names"]
