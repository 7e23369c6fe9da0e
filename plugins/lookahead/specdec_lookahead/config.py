"""Options with TensorRT-LLM's names and defaults (``LookaheadDecodingConfig``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from specdec import DraftingConfig

#: TensorRT-LLM's defaults.
DEFAULT_WINDOW, DEFAULT_NGRAM, DEFAULT_VERIFICATION_SET = 4, 3, 4
#: The deepest tree the base config allows (its bound on ``max_draft_len``).
MAX_DEPTH = 64


class LookaheadDecodingConfig(DraftingConfig):
    """Guess future tokens by Jacobi iteration over a 2D window, collect the n-grams the guesses
    form, and verify the pool's n-grams that follow the last token, all in one target forward.

    The draft shape follows from the three sizes: the window's ``max_window_size`` columns by
    ``max_ngram_size - 1`` rows, and up to ``max_verification_set_size`` n-grams of
    ``max_ngram_size - 1`` drafts each. ``max_draft_len`` is the resulting tree's depth, set
    from them.
    """

    method_name: ClassVar[str] = "lookahead"

    use_sa_spec: bool = Field(
        default=False,
        description=(
            "Suffix drafts over the method (TensorRT-LLM `use_sa_spec`); off by default: "
            "lookahead's n-gram pool drafts from the context already."
        ),
    )

    max_window_size: int = Field(
        default=DEFAULT_WINDOW, ge=1,
        description="Columns of the lookahead window: future positions guessed in parallel each step (W).",
    )
    max_ngram_size: int = Field(
        default=DEFAULT_NGRAM, ge=2,
        description="Length of the n-grams collected and verified, the key token included (N); the window keeps N - 1 rows.",
    )
    max_verification_set_size: int = Field(
        default=DEFAULT_VERIFICATION_SET, ge=1,
        description="Most n-grams verified per step, and kept in the pool per key token (G).",
    )

    @model_validator(mode="before")
    @classmethod
    def _depth_from_sizes(cls, data: Any) -> Any:
        """``max_draft_len`` is the tree's depth: the window's first row (W deep) with a column of
        N - 2 below its last guess."""
        if not isinstance(data, dict):
            return data
        for name in ("max_draft_len", "num_speculative_tokens"):
            if name in data:
                raise ValueError(f"{name}: lookahead's draft shape follows from max_window_size, max_ngram_size "
                                 "and max_verification_set_size; leave it out")
        window, ngram = data.get("max_window_size", DEFAULT_WINDOW), data.get("max_ngram_size", DEFAULT_NGRAM)
        if isinstance(window, int) and isinstance(ngram, int) and window >= 1 and ngram >= 2:
            if window + ngram - 2 > MAX_DEPTH:
                raise ValueError(f"max_window_size + max_ngram_size - 2 (the draft tree's depth) must be at most {MAX_DEPTH}")
            data = {**data, "max_draft_len": window + ngram - 2}
        return data

    @property
    def max_draft_tokens(self) -> int:
        """Nodes verified per step: the window's W * (N - 1) guesses and G n-grams of N - 1 drafts."""
        return (self.max_window_size + self.max_verification_set_size) * (self.max_ngram_size - 1)
