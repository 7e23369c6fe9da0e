"""Options with TensorRT-LLM's names (``speculative_model``, ``max_draft_len``) and vLLM's aliases."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field

from specdec import DraftingConfig, DraftVocabularyConfig


class DraftTargetDecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """A separate, smaller causal LM that shares the target's tokenizer drafts a chain of tokens."""

    method_name: ClassVar[str] = "draft_target"

    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "The draft model: a Hugging Face id or a local directory. Unset with the default target: "
            "the shipped SmolLM2 draft."
        ),
    )
    parallel_drafting: bool | None = Field(
        default=None,
        description=(
            "Draft every token of a step in one forward of the draft, from `max_draft_len - 1` mask tokens "
            "(PARD, vLLM's `parallel_drafting`); the draft must be a PARD draft, whose config.json names its "
            "mask token (`pard_token`). Unset: on exactly when the draft is one."
        ),
    )
    confidence_threshold: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        validation_alias=AliasChoices("confidence_threshold", "assistant_confidence_threshold"),
        description=(
            "Stop a request's chain after a draft token the draft itself gave less than this probability "
            "(transformers' `assistant_confidence_threshold`); 0 drafts the full length."
        ),
    )
