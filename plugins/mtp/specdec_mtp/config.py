"""MTP options with TensorRT-LLM's names (``MTPDecodingConfig``), accepting vLLM's dict too."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, model_validator

from specdec import DraftingConfig, DraftVocabularyConfig


class MTPDecodingConfig(DraftingConfig, DraftVocabularyConfig):
    """Draft with DeepSeek-V3 multi-token prediction (MTP) layers shipped beside the target's weights
    (DeepSeek-V3) or trained for it (``specdec train mtp``, any Llama-style target)."""

    method_name: ClassVar[str] = "mtp"

    max_draft_len: int = Field(
        default=1,
        ge=1,
        le=64,
        validation_alias=AliasChoices("max_draft_len", "num_speculative_tokens"),
        description=(
            "Tokens drafted per step; draft k comes from MTP layer k. Past the checkpoint's layers the last "
            "one is reused (vLLM); TensorRT-LLM requires it to equal num_nextn_predict_layers. Default 1."
        ),
    )
    num_nextn_predict_layers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "MTP layers to load, model.layers.{L} .. model.layers.{L+n-1} (L = num_hidden_layers). "
            "Default: that of the config.json beside the layers (speculative_model, else the target's checkpoint), "
            "else the target config's num_nextn_predict_layers."
        ),
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "Directory whose safetensors files hold the MTP layers, in DeepSeek-V3's layout. "
            "Default: the target's own checkpoint directory; for the default target (SmolLM2-135M-Instruct, which has "
            "none), the MTP layer this plugin ships for it."
        ),
    )
    use_relaxed_acceptance_for_thinking: bool = Field(
        default=False,
        description=(
            "TensorRT-LLM's relaxed acceptance, NOT lossless: inside a thinking span a draft is also kept when it is "
            "among the target's relaxed_topk tokens and log p(top 1) - log p(draft) <= relaxed_delta; exact outside. "
            "Default false."
        ),
    )
    relaxed_topk: int = Field(
        default=1, ge=1, description="Relaxed acceptance: how many of the target's top tokens a draft may be. Default 1."
    )
    relaxed_delta: float = Field(
        default=0.0,
        ge=0.0,
        description="Relaxed acceptance: the most a draft's log-probability may trail the top token's. Default 0.0.",
    )
    begin_thinking_phase_token: int | None = Field(
        default=None, ge=0, description="Token id opening a thinking span. Default: the tokenizer's <think>."
    )
    end_thinking_phase_token: int | None = Field(
        default=None, ge=0, description="Token id closing a thinking span. Default: the tokenizer's </think>."
    )

    @property
    def lossless(self) -> bool:
        """Whether every request's output is exactly the target's (relaxed acceptance off)."""
        return not self.use_relaxed_acceptance_for_thinking

    @model_validator(mode="after")
    def _distinct_thinking_tokens(self) -> MTPDecodingConfig:
        begin, end = self.begin_thinking_phase_token, self.end_thinking_phase_token
        if begin is not None and begin == end:
            raise ValueError(f"end_thinking_phase_token: {end} is also begin_thinking_phase_token; a span needs two tokens")
        return self
