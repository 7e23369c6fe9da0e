"""Speculative decoding configs: the shared base every method's config extends."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

#: ``use_sa_spec``'s description, shared by the base config (off) and :class:`DraftingConfig` (on).
USE_SA_SPEC = (
    "Take the suffix draft instead of the method's when the request's last sa_spec_threshold or more tokens "
    "occurred before, in its prompt and output or in a recent request's output (TensorRT-LLM `use_sa_spec`, "
    "off there by default; on here for every method that drafts with a model): the method drafts nothing for "
    "it that step."
)


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

    adaptive_window: int = Field(
        default=16,
        ge=1,
        le=1024,
        description=(
            "Steps in each request's rolling acceptance window that drives adaptive_draft_len. "
            "A request whose drafting was paused probes again once its window holds no drafts."
        ),
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("max_concurrency", "disable_by_batch_size", "speculative_disable_by_batch_size"),
        description="Decode plainly while more than this many requests run at once (vLLM `disable_by_batch_size`).",
    )
    draft_len_schedule: dict[int, int] | None = Field(
        default=None,
        description=(
            "Draft length by batch size, as in TensorRT-LLM: {4: 4, 8: 2, 32: 1} drafts 4 tokens for "
            "batches of 1-4, 2 for 5-8, 1 for 9-32 and none above 32."
        ),
    )
    use_sa_spec: bool = Field(default=False, description=USE_SA_SPEC)
    sa_spec_threshold: int = Field(
        default=4, ge=1, le=24,
        description="The shortest match, in tokens, whose suffix draft replaces the method's (TensorRT-LLM's name).",
    )
    sa_spec_max_draft_len: int = Field(
        default=24, ge=1, le=64,
        description=(
            "The most tokens a suffix draft holds, which may exceed the method's own max_draft_len: a long "
            "match is where a copy runs furthest (TensorRT-LLM caps it at max_draft_len; set it so to match). "
            "A match of m tokens drafts at most m + 4 (the suffix method's defaults), and adaptive_draft_len cuts "
            "each suffix draft by the acceptance suffix drafts have had."
        ),
    )

    @model_validator(mode="after")
    def _check_dynamic_controls(self) -> SpeculativeConfig:
        if self.use_sa_spec and self.max_draft_tokens == 0:
            raise ValueError("use_sa_spec: needs a method that drafts (max_draft_len > 0); "
                             "for suffix drafts alone, use the method 'suffix'")
        if self.draft_len_schedule is not None:
            if self.max_concurrency is not None:
                raise ValueError(
                    "draft_len_schedule and max_concurrency are mutually exclusive "
                    "(a schedule ends speculation above its largest batch size)"
                )
            for batch_size, length in self.draft_len_schedule.items():
                if batch_size < 1 or not 0 <= length <= self.max_draft_tokens:
                    raise ValueError(
                        f"draft_len_schedule: {{{batch_size}: {length}}} needs a batch size >= 1 "
                        f"and a draft length in [0, {self.max_draft_tokens}] (the most draft tokens per step)"
                    )
        return self

    @property
    def max_draft_tokens(self) -> int:
        """The most draft tokens one request verifies per step: ``max_draft_len`` for a chain.

        A tree method overrides it with its node count (its ``max_draft_len`` is the tree's
        depth); the engine's budgets, cuts and cost measurements count these tokens.
        """
        return self.max_draft_len

    @property
    def drafts_trees(self) -> bool:
        """Whether the method drafts trees, whose budgets count nodes and whose worth comes from
        each node's acceptance. By default, a method verifying more tokens than its depth
        (``max_draft_tokens > max_draft_len``); a method whose trees may be as deep as they are
        wide (suffix decoding) says so itself."""
        return self.max_draft_tokens > self.max_draft_len

    @property
    def max_verify_drafts(self) -> int:
        """The most draft tokens one request can verify in a step: the method's, or a longer
        suffix draft's (``use_sa_spec``). Verify forwards are prepared and their costs measured
        up to this many plus one."""
        return max(self.max_draft_tokens, self.sa_spec_max_draft_len if self.use_sa_spec else 0)

    def draft_len_for_batch(self, batch_size: int) -> int:
        """The most draft tokens per request for a step that runs ``batch_size`` requests."""
        if self.max_concurrency is not None and batch_size > self.max_concurrency:
            return 0
        if self.draft_len_schedule:
            fitting = [size for size in self.draft_len_schedule if size >= batch_size]
            return self.draft_len_schedule[min(fitting)] if fitting else 0
        return self.max_draft_tokens

    def model_post_init(self, context: Any) -> None:
        if self.decoding_type is None and self.method_name:
            object.__setattr__(self, "decoding_type", self.method_name)


class DraftingConfig(SpeculativeConfig):
    """The base of a method that drafts: at least one draft token per step.

    Suffix drafts over the method (``use_sa_spec``) are on by default here: where the context
    repeats itself, a copy costs microseconds and is accepted further than a model's guess. A
    method that drafts by copying its context already (n-gram, suffix, lookahead) turns them off.
    """

    max_draft_len: int = Field(
        default=4,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description="Most draft tokens proposed per step (vLLM `num_speculative_tokens`).",
    )
    use_sa_spec: bool = Field(default=True, description=USE_SA_SPEC)


class PlainDecodingConfig(SpeculativeConfig):
    """No speculation: one target forward per token. The baseline every method is measured against."""

    method_name: ClassVar[str] = "none"
    max_draft_len: int = Field(
        default=0, ge=0, le=0, validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens")
    )
