"""specdec hook implementations for MTP."""

from __future__ import annotations

from collections.abc import Callable

import click
import torch

from specdec import DraftProposal, Request, ResourceManager, SpeculativeConfig, TargetContext, VerifyResult, hookimpl
from specdec_mtp.config import MTPDecodingConfig
from specdec_mtp.drafter import MTPResources
from specdec_mtp.relaxed import relaxed_verify


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "mtp",
        MTPDecodingConfig,
        aliases=("MTP", "deepseek_mtp"),
        summary="MTP: DeepSeek-V3 multi-token prediction layers draft from the target's final hidden state.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return MTPResources(config, target) if isinstance(config, MTPDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: MTPResources
) -> list[DraftProposal] | None:
    if not isinstance(config, MTPDecodingConfig):
        return None
    return resource_manager.propose(requests)


@hookimpl
def specdec_verify(
    config: SpeculativeConfig, requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult] | None:
    """Relaxed acceptance inside thinking spans when asked for; otherwise the core's lossless verification."""
    if not isinstance(config, MTPDecodingConfig) or config.lossless:
        return None
    spans = [r.method_state.thinking for r in requests]
    return relaxed_verify(requests, proposals, target_logits, spans, config.relaxed_topk, config.relaxed_delta)


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: MTPResources
) -> None:
    if isinstance(config, MTPDecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.commit(request, result)


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_mtp.training.cli import mtp

    return [mtp]
