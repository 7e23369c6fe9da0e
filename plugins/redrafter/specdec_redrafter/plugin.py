"""specdec hook implementations for ReDrafter."""

from __future__ import annotations

from collections.abc import Callable

import click

from specdec import (
    DraftProposal,
    Request,
    ResourceManager,
    SpeculativeConfig,
    TargetContext,
    VerifyResult,
    hookimpl,
)
from specdec_redrafter.config import ReDrafterDecodingConfig
from specdec_redrafter.drafter import ReDrafterResources


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "redrafter",
        ReDrafterDecodingConfig,
        aliases=("ReDrafter", "recurrent_drafting", "explicit_draft_tokens"),
        summary="ReDrafter: a recurrent drafter on the target's last hidden state drafts beams, verified as one tree.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return ReDrafterResources(config, target) if isinstance(config, ReDrafterDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: ReDrafterResources
) -> list[DraftProposal] | None:
    if not isinstance(config, ReDrafterDecodingConfig):
        return None
    return resource_manager.propose(requests)


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: ReDrafterResources
) -> None:
    if isinstance(config, ReDrafterDecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.commit(request, result)


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_redrafter.training.cli import redrafter

    return [redrafter]
