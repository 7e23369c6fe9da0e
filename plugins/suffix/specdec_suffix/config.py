"""Options with vLLM's names and defaults (``method: suffix``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, model_validator

from specdec import SUFFIX_DEFAULTS, DraftingConfig


class SuffixDecodingConfig(DraftingConfig):
    """Draft what followed the context's longest matching suffix in this request or in recent outputs."""

    method_name: ClassVar[str] = "suffix"

    use_sa_spec: bool = Field(
        default=False,
        description=(
            "Suffix drafts over the method (TensorRT-LLM `use_sa_spec`); off by default: "
            "this method drafts from the same suffix trees."
        ),
    )

    max_draft_len: int = Field(
        default=SUFFIX_DEFAULTS.max_tree_depth,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description=(
            "Most draft tokens per step (vLLM `num_speculative_tokens`, which for suffix decoding defaults to "
            "the tree depth). A short match drafts fewer (`suffix_decoding_max_spec_factor`)."
        ),
    )
    suffix_decoding_max_tree_depth: int = Field(
        default=SUFFIX_DEFAULTS.max_tree_depth, ge=1, le=256,
        description="Longest suffix matched, and the depth of the trees that store the tokens.",
    )
    suffix_decoding_max_cached_requests: int = Field(
        default=SUFFIX_DEFAULTS.max_cached_requests, ge=0,
        description="Finished requests whose outputs the global tree keeps, oldest evicted first; 0 turns it off.",
    )
    suffix_decoding_max_cached_tokens: int = Field(
        default=SUFFIX_DEFAULTS.max_cached_tokens, ge=0,
        description=(
            "The most output tokens of finished requests the global tree keeps, oldest evicted first: it bounds "
            "the cache's memory (each token adds up to `suffix_decoding_max_tree_depth` tree nodes)."
        ),
    )
    suffix_decoding_max_spec_factor: float = Field(
        default=SUFFIX_DEFAULTS.max_spec_factor, ge=0.0,
        description="A match of m tokens drafts at most max_spec_factor * m + max_spec_offset tokens.",
    )
    suffix_decoding_max_spec_offset: float = Field(
        default=SUFFIX_DEFAULTS.max_spec_offset,
        description=(
            "Added to max_spec_factor * m (arctic-inference's `max_spec_offset`; 0 there and in vLLM, which has no "
            "such option). 4 lets a fresh match, such as a reply returning to its prompt's text after an edit, "
            "draft a few tokens past its length; the adaptive draft length cuts what does not pay."
        ),
    )
    suffix_decoding_min_token_prob: float = Field(
        default=SUFFIX_DEFAULTS.min_token_prob, ge=0.0, le=1.0,
        description="Draft only tokens whose estimated probability (their path's frequency share) is at least this.",
    )
    suffix_decoding_tree_spec: bool = Field(
        default=True,
        description=(
            "Draft a tree (the most probable continuations, best first); a chain (the most probable path) otherwise."
        ),
    )

    @property
    def drafts_trees(self) -> bool:
        """A tree of up to ``max_draft_len`` nodes, as deep as a match allows (``suffix_decoding_tree_spec``)."""
        return self.suffix_decoding_tree_spec

    @model_validator(mode="after")
    def _draft_within_depth(self) -> SuffixDecodingConfig:
        if self.max_draft_len > self.suffix_decoding_max_tree_depth and not self.suffix_decoding_tree_spec:
            raise ValueError("max_draft_len (num_speculative_tokens): a chain cannot be longer than "
                             "suffix_decoding_max_tree_depth")
        return self
