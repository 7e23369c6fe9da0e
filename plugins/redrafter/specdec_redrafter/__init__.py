"""ReDrafter (Apple, "Recurrent Drafter for Fast Speculative Decoding in Large Language Models",
arXiv 2403.09919; TensorRT-LLM's ``explicit_draft_tokens`` mode) for specdec."""

from specdec_redrafter.config import ReDrafterDecodingConfig
from specdec_redrafter.drafter_model import (
    DrafterSpec,
    RecurrentDrafter,
    load_drafter,
    save_drafter,
)

__all__ = ["DrafterSpec", "ReDrafterDecodingConfig", "RecurrentDrafter", "load_drafter", "save_drafter"]
