"""Method ``none``: plain decoding, one target forward per token."""

from __future__ import annotations

from collections.abc import Callable

from specdec.config import PlainDecodingConfig, SpeculativeConfig
from specdec.hookspecs import hookimpl
from specdec.requests import DraftProposal, Request


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register("none", PlainDecodingConfig, aliases=("plain", "off"), summary="Plain decoding: no speculation (the baseline).")


@hookimpl
def specdec_prepare_draft_tokens(config: SpeculativeConfig, requests: list[Request]) -> list[DraftProposal] | None:
    if not isinstance(config, PlainDecodingConfig):
        return None
    return [DraftProposal() for _ in requests]
