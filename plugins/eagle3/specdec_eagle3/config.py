"""EAGLE-3 options with TensorRT-LLM's names (``Eagle3DecodingConfig``), accepting vLLM's dict too.

Tree options follow EAGLE-2 and SGLang: ``max_draft_len`` is the tree's depth, ``eagle_topk`` the
branching per expansion and ``num_draft_tokens`` the nodes kept after reranking.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import AliasChoices, Field, field_validator, model_validator

from specdec import DraftingConfig, DraftVocabularyConfig

#: The most draft tree nodes one step verifies (a bound on the target forward's width).
MAX_TREE_NODES = 512
SGLANG_NUM_DRAFT_TOKENS = "speculative_num_draft_tokens"


class Eagle3DecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """Draft with an EAGLE-3 head that reads the target's hidden states."""

    method_name: ClassVar[str] = "eagle3"

    max_draft_len: int = Field(
        default=4,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens", "speculative_num_steps"),
        description="Length of the drafted chain; with eagle_topk > 1, the depth of the draft tree.",
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "Directory of the EAGLE-3 head checkpoint, SafeAILab or vLLM speculators layout. "
            "Default: the head shipped for the default target (SmolLM2-135M-Instruct); required for any other target."
        ),
    )
    eagle3_layers_to_capture: list[int] | None = Field(
        default=None,
        description=(
            "Target layers whose input hidden states are fused: i is the state entering decoder layer i "
            "(TensorRT-LLM's i - 1). Default: the layers the checkpoint records, else {2, L//2, L-3}."
        ),
    )

    eagle_topk: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias=AliasChoices("eagle_topk", "speculative_eagle_topk"),
        description="Branching of the draft tree: each depth expands the top-k nodes into top-k children each (1 = a chain).",
    )
    num_draft_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TREE_NODES,
        validation_alias=AliasChoices("num_draft_tokens", "max_total_draft_tokens"),
        description=(
            "Draft tree nodes kept per step (the root, the last committed token, not counted), the best by "
            "cumulative draft log-probability. Default: max_draft_len for a chain, eagle_topk * max_draft_len "
            "for a tree. SGLang's speculative_num_draft_tokens counts the root, so it is this plus 1."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _sglang_token_count(cls, data: Any) -> Any:
        """SGLang's ``speculative_num_draft_tokens`` counts the verified root token as well."""
        if not isinstance(data, dict) or SGLANG_NUM_DRAFT_TOKENS not in data:
            return data
        data = dict(data)
        value = data.pop(SGLANG_NUM_DRAFT_TOKENS)
        if any(key in data for key in ("num_draft_tokens", "max_total_draft_tokens")):
            raise ValueError(f"{SGLANG_NUM_DRAFT_TOKENS}: give it or num_draft_tokens, not both")
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(
                f"{SGLANG_NUM_DRAFT_TOKENS}: must be an integer >= 2 (SGLang counts the root token, "
                f"so it is num_draft_tokens + 1), got {value!r}"
            )
        data["num_draft_tokens"] = value - 1
        return data

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
    def _tree_fits(self) -> Eagle3DecodingConfig:
        nodes, depth, topk = self.num_draft_tokens, self.max_draft_len, self.eagle_topk
        if nodes is None:
            return self
        if topk == 1 and nodes != depth:
            raise ValueError(
                f"num_draft_tokens: with eagle_topk 1 the draft is a chain of max_draft_len ({depth}) tokens, "
                f"got {nodes}; set eagle_topk > 1 for a tree"
            )
        if nodes < depth:
            raise ValueError(
                f"num_draft_tokens: {nodes} nodes cannot reach the tree depth max_draft_len ({depth}); "
                f"keep at least {depth} or lower max_draft_len"
            )
        most = tree_candidates(depth, topk)
        if nodes > most:
            raise ValueError(
                f"num_draft_tokens: a tree of depth {depth} with eagle_topk {topk} has at most {most} "
                f"candidate nodes, got {nodes}"
            )
        return self

    @property
    def is_tree(self) -> bool:
        """Whether greedy requests draft a tree (sampled requests always draft a chain)."""
        return self.eagle_topk > 1

    @property
    def max_draft_tokens(self) -> int:
        """Nodes verified per step: the kept tree nodes, or the chain's length."""
        if not self.is_tree:
            return self.max_draft_len
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        return min(self.eagle_topk * self.max_draft_len, tree_candidates(self.max_draft_len, self.eagle_topk), MAX_TREE_NODES)


def tree_candidates(depth: int, topk: int) -> int:
    """Candidate nodes an EAGLE-2 expansion produces: top-k children of the root, then of each of
    the top-k nodes at every further depth."""
    return topk + (depth - 1) * topk * topk
