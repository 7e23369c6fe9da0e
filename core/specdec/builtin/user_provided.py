"""Method ``user_provided``: the user passes a drafter object, no plugin package needed.

The drafter implements ``prepare_draft_tokens(requests, resource_manager)`` returning, per
request, a :class:`~specdec.requests.DraftProposal` or a plain list of token ids; it may also
implement ``accept(requests, results)`` to learn what was kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from pydantic import Field, field_validator

from specdec.config import SpeculativeConfig
from specdec.errors import PluginError
from specdec.hookspecs import hookimpl
from specdec.proposal_checks import described
from specdec.requests import DraftProposal, Request, VerifyResult
from specdec.resources import ResourceManager, TargetContext


class UserProvidedDecodingConfig(SpeculativeConfig):
    """Speculate with a drafter object written by the user."""

    method_name: ClassVar[str] = "user_provided"
    model_config = SpeculativeConfig.model_config | {"arbitrary_types_allowed": True}

    drafter: Any = Field(description="Object with prepare_draft_tokens(requests, resource_manager).", exclude=True)
    resource_manager: Any = Field(default=None, exclude=True, description="Optional ResourceManager for the drafter.")

    @field_validator("resource_manager")
    @classmethod
    def _is_manager(cls, manager: Any) -> Any:
        if manager is not None and not isinstance(manager, ResourceManager):
            raise ValueError("must be a specdec.ResourceManager or None")
        return manager

    @field_validator("drafter")
    @classmethod
    def _has_prepare(cls, drafter: Any) -> Any:
        if not callable(getattr(drafter, "prepare_draft_tokens", None)):
            raise ValueError("must implement prepare_draft_tokens(requests, resource_manager)")
        return drafter


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "user_provided",
        UserProvidedDecodingConfig,
        aliases=("user", "custom"),
        summary="Your own drafter object (Python API only).",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    if not isinstance(config, UserProvidedDecodingConfig) or config.resource_manager is None:
        return None
    return config.resource_manager


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: ResourceManager
) -> list[DraftProposal] | None:
    if not isinstance(config, UserProvidedDecodingConfig):
        return None
    proposals = config.drafter.prepare_draft_tokens(requests, resource_manager)
    expected = f"expected a list of {len(requests)} proposals (DraftProposal or a list of token ids), one per request"
    if not isinstance(proposals, (list, tuple)):
        raise PluginError(f"user drafter returned {described(proposals)}; {expected}")
    if len(proposals) != len(requests):
        raise PluginError(f"user drafter returned {len(proposals)} proposals for {len(requests)} requests; {expected}")
    return [_as_proposal(p) for p in proposals]


def _as_proposal(item: Any) -> Any:
    """A token list wrapped as a chain, as it is; anything else unchanged. The engine checks
    every proposal (type, token ids, parents, probabilities) and names what was expected."""
    return DraftProposal(item) if isinstance(item, (list, tuple, torch.Tensor)) else item


@hookimpl
def specdec_accept(config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult]) -> None:
    if isinstance(config, UserProvidedDecodingConfig) and hasattr(config.drafter, "accept"):
        config.drafter.accept(requests, results)
