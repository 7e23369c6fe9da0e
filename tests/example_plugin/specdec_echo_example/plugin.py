"""specdec hook implementations for the echo method (the entry point's module)."""

from __future__ import annotations

from collections.abc import Callable

from specdec import DraftProposal, Request, ResourceManager, SpeculativeConfig, hookimpl
from specdec_echo_example.config import EchoDecodingConfig


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "echo",
        EchoDecodingConfig,
        aliases=("repeat_last",),
        summary="Example plugin: drafts the last token, repeated.",
    )


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: ResourceManager
) -> list[DraftProposal] | None:
    if not isinstance(config, EchoDecodingConfig):
        return None
    proposals = []
    for request in requests:
        if config.fail_on_token is not None and config.fail_on_token in request.token_ids:
            raise RuntimeError(f"echo: token {config.fail_on_token} in request {request.request_id}")
        n = request.max_draft_len if config.repeat == 0 else min(config.repeat, request.max_draft_len)
        proposals.append(DraftProposal([request.token_ids[-1]] * n))
    return proposals
