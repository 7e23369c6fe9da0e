"""MTP options with TensorRT-LLM's names (``MTPDecodingConfig``), accepting vLLM's dict too."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, model_validator

from specdec import DraftingConfig

#: TensorRT-LLM's relaxed-acceptance options: accepted so configs written for it parse, refused when set.
RELAXED_OPTIONS = ("use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta", "begin_thinking_phase_token",
                   "end_thinking_phase_token")


class MTPDecodingConfig(DraftingConfig):
    """Draft with DeepSeek-V3 multi-token prediction (MTP) layers shipped beside the target's weights."""

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
            "Default: the target config's num_nextn_predict_layers."
        ),
    )
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir", "model"),
        description=(
            "Directory whose safetensors files hold the MTP layers, in DeepSeek-V3's layout. "
            "Default: the target's own checkpoint directory."
        ),
    )
    use_relaxed_acceptance_for_thinking: bool = Field(
        default=False, description="TensorRT-LLM's relaxed acceptance inside thinking spans: not implemented yet; must stay false."
    )
    relaxed_topk: int | None = Field(default=None, description="Relaxed acceptance's top-k: not implemented yet; leave unset.")
    relaxed_delta: float | None = Field(
        default=None, description="Relaxed acceptance's log-probability margin: not implemented yet; leave unset."
    )
    begin_thinking_phase_token: int | None = Field(
        default=None, description="Token id opening a thinking span (relaxed acceptance): not implemented yet; leave unset."
    )
    end_thinking_phase_token: int | None = Field(
        default=None, description="Token id closing a thinking span (relaxed acceptance): not implemented yet; leave unset."
    )

    @model_validator(mode="after")
    def _no_relaxed_acceptance(self) -> MTPDecodingConfig:
        used = [name for name in RELAXED_OPTIONS if getattr(self, name) not in (None, False)]
        if used:
            raise ValueError(f"{used[0]}: relaxed acceptance for thinking is not implemented yet; MTP verifies losslessly")
        return self
