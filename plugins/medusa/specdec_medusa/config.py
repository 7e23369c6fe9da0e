"""Medusa options with TensorRT-LLM's names (``MedusaDecodingConfig``), accepting vLLM's dict too.

The draft is a static tree (``medusa_choices``). As for every tree method of specdec,
``max_draft_len`` is the tree's depth (vLLM's ``num_speculative_tokens``: the heads that draft)
and :attr:`MedusaDecodingConfig.max_draft_tokens` its node count, what the engine budgets.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from specdec import DraftingConfig, DraftVocabularyConfig
from specdec_medusa.choices import MC_SIM_7B_63, cut_to_depth, expand_choices

#: The most draft tree nodes one step verifies (a bound on the target forward's width).
MAX_TREE_NODES = 512
#: The most heads a tree may use (the base config's bound on ``max_draft_len``).
MAX_DEPTH = 64
_DEPTH_NAMES = ("max_draft_len", "num_speculative_tokens")


class MedusaDecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """Draft a static tree from Medusa heads that read the target's last hidden state."""

    method_name: ClassVar[str] = "medusa"

    max_draft_len: int = Field(
        default=4,
        ge=1,
        le=MAX_DEPTH,
        validation_alias=AliasChoices(*_DEPTH_NAMES),
        description=(
            "Depth of the draft tree: heads 1..max_draft_len draft (vLLM num_speculative_tokens). "
            "Default: the depth of medusa_choices (4 for the default tree), at most num_medusa_heads."
        ),
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description="Directory of the Medusa heads, FasterDecoding or vLLM layout (required).",
    )
    num_medusa_heads: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DEPTH,
        description="Heads to use, the first ones of the checkpoint. Default: all the checkpoint has.",
    )
    medusa_choices: list[list[int]] | None = Field(
        default=None,
        description=(
            "The draft tree as paths of top-k indices, every candidate or only the unique paths "
            "(TensorRT-LLM's two forms). Default: Medusa's mc_sim_7b_63, cut to the heads used."
        ),
    )
    acceptance: Literal["lossless", "typical"] = Field(
        default="lossless",
        validation_alias=AliasChoices("acceptance", "acceptance_mode"),
        description=(
            "lossless: the core's verification (exact for greedy and seeded requests, rejection sampling "
            "otherwise). typical: Medusa's typical acceptance for sampled requests, NOT lossless."
        ),
    )
    posterior_threshold: float = Field(
        default=0.09, gt=0, le=1, description="Typical acceptance: the probability a draft needs at most (epsilon)."
    )
    posterior_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Typical acceptance: the entropy-scaled bound alpha * exp(-H) (delta)."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_depth(cls, data: Any) -> Any:
        """Without an explicit depth, the tree's own depth (at most ``num_medusa_heads``)."""
        if not isinstance(data, dict) or any(name in data for name in _DEPTH_NAMES):
            return data
        choices = data.get("medusa_choices")
        try:
            depth = max((len(c) for c in choices), default=1) if choices else max(len(c) for c in MC_SIM_7B_63)
            heads = data.get("num_medusa_heads")
            if isinstance(heads, int) and not isinstance(heads, bool) and heads >= 1:
                depth = min(depth, heads)
        except TypeError:
            return data  # the field validators name what is wrong
        return {**data, "max_draft_len": min(depth, MAX_DEPTH)}

    @field_validator("medusa_choices")
    @classmethod
    def _valid_tree(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one path")
        nodes = expand_choices(value)
        if len(nodes) > MAX_TREE_NODES:
            raise ValueError(f"the tree has {len(nodes)} nodes; at most {MAX_TREE_NODES} are verified per step")
        if max(len(n) for n in nodes) > MAX_DEPTH:
            raise ValueError(f"paths may be at most {MAX_DEPTH} long (one per head)")
        return value

    @property
    def depth(self) -> int:
        """The deepest level drafted: ``max_draft_len``, at most ``num_medusa_heads``."""
        return min(self.max_draft_len, self.num_medusa_heads or MAX_DEPTH)

    def tree(self) -> list[tuple[int, ...]]:
        """The draft tree's nodes as top-k paths, parents first, cut to :attr:`depth`."""
        nodes = expand_choices(self.medusa_choices) if self.medusa_choices is not None else list(MC_SIM_7B_63)
        return cut_to_depth(nodes, self.depth)

    @property
    def max_draft_tokens(self) -> int:
        """Nodes verified per step: the tree's (a checkpoint with fewer heads drafts fewer)."""
        return len(self.tree())

    @property
    def lossless(self) -> bool:
        """Whether every request's output is exactly the target's (``acceptance == "lossless"``)."""
        return self.acceptance == "lossless"
