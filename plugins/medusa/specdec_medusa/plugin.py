"""specdec hook implementations for Medusa."""

from __future__ import annotations

from collections.abc import Callable

import click
import torch

from specdec import DraftProposal, Request, ResourceManager, SpeculativeConfig, TargetContext, VerifyResult, hookimpl
from specdec_medusa.config import MedusaDecodingConfig
from specdec_medusa.drafter import MedusaResources
from specdec_medusa.typical import typical_verify


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "medusa",
        MedusaDecodingConfig,
        summary="Medusa: extra heads on the target's last hidden state draft a static tree.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return MedusaResources(config, target) if isinstance(config, MedusaDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: MedusaResources
) -> list[DraftProposal] | None:
    if not isinstance(config, MedusaDecodingConfig):
        return None
    return resource_manager.propose(requests)


@hookimpl
def specdec_verify(
    config: SpeculativeConfig, requests: list[Request], proposals: list[DraftProposal], target_logits: list[torch.Tensor]
) -> list[VerifyResult] | None:
    """Typical acceptance when asked for; otherwise the core's lossless verification."""
    if not isinstance(config, MedusaDecodingConfig) or config.lossless:
        return None
    return typical_verify(requests, proposals, target_logits, config.posterior_threshold, config.posterior_alpha)


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: MedusaResources
) -> None:
    if isinstance(config, MedusaDecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.commit(request, result)


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_medusa.training.cli import medusa

    return [medusa]
