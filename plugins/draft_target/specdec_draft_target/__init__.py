"""Draft/target speculation for specdec: a small model with the target's tokenizer drafts."""

from specdec_draft_target.config import DraftTargetDecodingConfig
from specdec_draft_target.drafter import DraftModel

__all__ = ["DraftModel", "DraftTargetDecodingConfig"]
