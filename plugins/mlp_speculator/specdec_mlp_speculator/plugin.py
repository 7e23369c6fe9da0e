"""specdec hook implementations for the MLP speculator."""

from __future__ import annotations

from collections.abc import Callable

import click

from specdec import DraftProposal, Request, ResourceManager, SpeculativeConfig, TargetContext, VerifyResult, hookimpl
from specdec_mlp_speculator.config import MLPSpeculatorDecodingConfig
from specdec_mlp_speculator.drafter import MLPSpeculatorResources


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "mlp_speculator",
        MLPSpeculatorDecodingConfig,
        aliases=("MLPSpeculator",),
        summary="MLP speculator: one small stage per draft position on the target's last hidden state.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return MLPSpeculatorResources(config, target) if isinstance(config, MLPSpeculatorDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: MLPSpeculatorResources
) -> list[DraftProposal] | None:
    if not isinstance(config, MLPSpeculatorDecodingConfig):
        return None
    return resource_manager.propose(requests)


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: MLPSpeculatorResources
) -> None:
    if isinstance(config, MLPSpeculatorDecodingConfig):
        for request, result in zip(requests, results):
            resource_manager.commit(request, result)


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_mlp_speculator.training.cli import mlp_speculator

    return [mlp_speculator]
