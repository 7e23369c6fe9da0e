"""Options with TensorRT-LLM's names (``speculative_model``, ``max_draft_len``) and vLLM's aliases."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field

from specdec import SpeculativeConfig


class DraftTargetDecodingConfig(SpeculativeConfig):
    """A separate, smaller causal LM that shares the target's tokenizer drafts a chain of tokens."""

    method_name: ClassVar[str] = "draft_target"

    max_draft_len: int = Field(
        default=4,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description="Draft tokens the draft model proposes per step (vLLM `num_speculative_tokens`).",
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "The draft model: a Hugging Face id or a local directory. Unset with the default target: "
            "the shipped SmolLM2 draft."
        ),
    )
