"""Options with TensorRT-LLM's names (``speculative_model``, ``max_draft_len``) and vLLM's aliases."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field

from specdec import DraftingConfig


class DraftTargetDecodingConfig(DraftingConfig):
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
    draft_vocab_size: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Draft over only this many target tokens, those the target's replies use most (ranked in "
            "`draft_vocab`): the draft's output layer keeps only their rows, which makes each draft forward "
            "cheaper. Unset: the full vocabulary, except for the shipped draft, which keeps 8192 tokens of its "
            "shipped ranking."
        ),
    )
    draft_vocab: str | None = Field(
        default=None,
        description=(
            "The token ranking for `draft_vocab_size`: a safetensors file from `specdec train draft-vocab`. "
            "Unset with the shipped draft: the ranking shipped with it."
        ),
    )
