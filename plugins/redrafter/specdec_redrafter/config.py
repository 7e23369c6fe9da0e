"""Options with TensorRT-LLM's names and defaults (``redrafter_num_beams``, ``redrafter_draft_len_per_beam``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field

from specdec import DraftingConfig, DraftVocabularyConfig


class ReDrafterDecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """Draft beams with a recurrent drafter on the target's last hidden state; verify them as one tree."""

    method_name: ClassVar[str] = "redrafter"

    max_draft_len: int = Field(
        default=5, ge=1, le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens", "redrafter_draft_len_per_beam"),
        description=(
            "Draft tokens per beam (TensorRT-LLM `redrafter_draft_len_per_beam`; Apple's `beam_length` is one more, "
            "as it counts the last committed token). Unset: the drafter config's `redrafter_draft_len_per_beam` "
            "where it has one, else 5."
        ),
    )
    redrafter_num_beams: int = Field(
        default=5, ge=1, le=64,
        validation_alias=AliasChoices("redrafter_num_beams", "beam_width"),
        description=(
            "Beams the drafter's beam search keeps (TensorRT-LLM's name; Apple's `beam_width`). Unset: the drafter "
            "config's `redrafter_num_beams` where it has one, else 5."
        ),
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "The drafter: a local directory in apple/ml-recurrent-drafter's layout (config.json, model.safetensors). "
            "Unset with the default target: the drafter shipped for it."
        ),
    )

    @property
    def max_draft_tokens(self) -> int:
        """Nodes one step verifies at most: every beam's drafts (beams sharing a prefix share its nodes)."""
        return self.redrafter_num_beams * self.max_draft_len
