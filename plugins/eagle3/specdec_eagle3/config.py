"""EAGLE-3 options with TensorRT-LLM's names (``Eagle3DecodingConfig``), accepting vLLM's dict too."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, field_validator, model_validator

from specdec import SpeculativeConfig


class Eagle3DecodingConfig(SpeculativeConfig):
    """Draft with an EAGLE-3 head that reads the target's hidden states."""

    method_name: ClassVar[str] = "eagle3"

    max_draft_len: int = Field(
        default=4,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description="Most draft tokens per step (a chain drafted by the head).",
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description="Directory of the EAGLE-3 head checkpoint, SafeAILab or vLLM speculators layout (required).",
    )
    eagle3_layers_to_capture: list[int] | None = Field(
        default=None,
        description=(
            "Target layers whose input hidden states are fused: i is the state entering decoder layer i "
            "(TensorRT-LLM's i - 1). Default: the layers the checkpoint records, else {2, L//2, L-3}."
        ),
    )

    @field_validator("eagle3_layers_to_capture")
    @classmethod
    def _distinct_layers(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one layer")
        if min(value) < 0:
            raise ValueError("layer numbers must be >= 0")
        if len(set(value)) != len(value):
            raise ValueError("layer numbers must be distinct")
        return sorted(value)

    @model_validator(mode="after")
    def _needs_a_head(self) -> Eagle3DecodingConfig:
        if not self.speculative_model:
            raise ValueError("speculative_model is required: the directory of an EAGLE-3 head checkpoint")
        return self
