"""Speculative decoding configs: the shared base every method's config extends."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class SpeculativeConfig(BaseModel):
    """Fields every speculation method shares.

    A method plugin subclasses this, adds its own options and registers the class through
    ``specdec_register_methods``. ``decoding_type`` is filled in from the registry, so users
    may omit it when they build a config object directly.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    #: The canonical method name this class is registered under (set by the class).
    method_name: ClassVar[str] = ""

    decoding_type: str | None = Field(
        default=None, description="Method name (TensorRT-LLM `decoding_type`, vLLM `method`)."
    )
    max_draft_len: int = Field(
        default=4,
        ge=0,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description="Most draft tokens proposed per step (vLLM `num_speculative_tokens`).",
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description="Draft model or head: a Hugging Face id or a local directory.",
    )

    adaptive_draft_len: bool = Field(
        default=True,
        description=(
            "Cut each proposal to the length with the most expected tokens per unit of verify cost, "
            "from the target's measured forward cost by width and the request's recent acceptance "
            "(0 drafts when speculating would not pay)."
        ),
    )

    def model_post_init(self, context: Any) -> None:
        if self.decoding_type is None and self.method_name:
            object.__setattr__(self, "decoding_type", self.method_name)


class PlainDecodingConfig(SpeculativeConfig):
    """No speculation: one target forward per token. The baseline every method is measured against."""

    method_name: ClassVar[str] = "none"
    max_draft_len: int = Field(
        default=0, ge=0, le=0, validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens")
    )
