"""specdec hook implementations for EAGLE-3."""

from __future__ import annotations

from collections.abc import Callable

import click

from specdec import DraftProposal, Request, ResourceManager, SpeculativeConfig, TargetContext, VerifyResult, hookimpl
from specdec_eagle3.config import Eagle3DecodingConfig
from specdec_eagle3.drafter import Eagle3Resources


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "eagle3",
        Eagle3DecodingConfig,
        aliases=("Eagle", "Eagle3"),
        summary="EAGLE-3: a one-layer head drafts from the target's fused hidden states.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return Eagle3Resources(config, target) if isinstance(config, Eagle3DecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: Eagle3Resources
) -> list[DraftProposal] | None:
    if not isinstance(config, Eagle3DecodingConfig):
        return None
    return resource_manager.propose(requests)


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: Eagle3Resources
) -> None:
    if isinstance(config, Eagle3DecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.commit(request, result)


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_eagle3.training.cli import eagle3

    return [eagle3]
