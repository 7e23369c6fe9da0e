"""Options with TensorRT-LLM's names and meanings, plus vLLM's ``prompt_lookup_min/max``."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, model_validator

from specdec import DraftingConfig


class NGramDecodingConfig(DraftingConfig):
    """Draft by looking up the context's last tokens in a pool of earlier n-grams."""

    method_name: ClassVar[str] = "ngram"

    use_sa_spec: bool = Field(
        default=False,
        description=(
            "Suffix drafts over the method (TensorRT-LLM `use_sa_spec`); off by default: "
            "n-gram drafts are copies of the context already."
        ),
    )

    max_matching_ngram_size: int = Field(
        default=4,
        ge=1,
        validation_alias=AliasChoices("max_matching_ngram_size", "prompt_lookup_max"),
        description="Longest context suffix matched against the pool (vLLM `prompt_lookup_max`); longer matches are tried first.",
    )
    prompt_lookup_min: int = Field(default=1, ge=1, description="Shortest suffix matched (vLLM).")
    is_public_pool: bool = Field(
        default=False,
        description="One pool shared by all requests instead of one per request (kept until the LLM closes, bounded by max_cached_requests).",
    )
    max_cached_requests: int = Field(
        default=256,
        ge=0,
        description=(
            "With is_public_pool: the most finished requests whose n-grams the shared pool keeps; the oldest "
            "are evicted first (vLLM's suffix_decoding_max_cached_requests). Running requests are always kept."
        ),
    )
    is_keep_all: bool = Field(
        default=True, description="Keep every candidate per key; if false, keep only the largest (longest) one."
    )
    is_use_oldest: bool = Field(
        default=True, description="Propose the oldest candidate for a match (else the newest). Needs is_keep_all."
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> NGramDecodingConfig:
        if self.prompt_lookup_min > self.max_matching_ngram_size:
            raise ValueError("prompt_lookup_min must not exceed max_matching_ngram_size (prompt_lookup_max)")
        return self
