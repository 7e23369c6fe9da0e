"""Options with vLLM's names (``method: mlp_speculator``) and IBM's for the tree."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field

from specdec import DraftingConfig, DraftVocabularyConfig


class MLPSpeculatorDecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """Draft with an MLP speculator: one small stage per draft position on the target's last hidden state."""

    method_name: ClassVar[str] = "mlp_speculator"

    max_draft_len: int = Field(
        default=3, ge=1, le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description="Draft positions per step (vLLM `num_speculative_tokens`): at most the checkpoint's `n_predict` stages.",
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "The speculator: a local directory in IBM's layout (config.json with `model_type: mlp_speculator`) or "
            "a compact checkpoint. Unset with the default target: the speculator shipped for it."
        ),
    )
    top_k_tokens_per_head: list[int] | None = Field(
        default=None,
        description=(
            "Tree drafts for greedy and seeded requests: stage i keeps its top k_i tokens under each node "
            "(IBM's name; unset: the checkpoint's, [1, 1, ...] drafts a chain). Sampled requests draft a chain."
        ),
    )
    num_draft_tokens: int = Field(
        default=10, ge=1, le=128,
        description="The most tree nodes one step verifies: the best-scoring nodes of the tree, parents first.",
    )

    @property
    def max_draft_tokens(self) -> int:
        return max(self.max_draft_len, self.num_draft_tokens)
