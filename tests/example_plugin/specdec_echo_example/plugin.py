"""specdec hook implementations for the echo method (the entry point's module)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec import (DraftProposal, LogitsProcessor, Request, ResourceManager, SamplingParams, SpeculativeConfig,
                     TargetContext, VerifyRows, hookimpl)
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


class BanToken(LogitsProcessor):
    """Never lets ``token`` be generated (or raises, to show a failing processor's effect)."""

    def __init__(self, token: int, fail: bool) -> None:
        self.token, self.fail = token, fail

    def apply(self, logits: torch.Tensor, rows: VerifyRows) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("echo: this processor always fails")
        logits[:, self.token] = float("-inf")
        return logits


@hookimpl
def specdec_logits_processors(params: SamplingParams, target: TargetContext) -> list[LogitsProcessor] | None:
    """``extra_args={"echo_ban": token}`` bans a token, whatever method runs;
    ``{"echo_ban_fails": "hook" | "apply"}`` fails in the hook or in the processor."""
    args = params.extra_args or {}
    if args.get("echo_ban_fails") == "hook":
        raise RuntimeError("echo: this hook always fails")
    if "echo_ban" not in args:
        return None
    return [BanToken(int(args["echo_ban"]), args.get("echo_ban_fails") == "apply")]
