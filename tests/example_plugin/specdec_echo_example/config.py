"""The echo method's options: the shared ones plus ``repeat`` and, for failure tests, ``fail_on_token``."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from specdec import SpeculativeConfig


class EchoDecodingConfig(SpeculativeConfig):
    """Draft the last token of the context, repeated."""

    method_name: ClassVar[str] = "echo"

    repeat: int = Field(
        default=0,
        ge=0,
        description="Most copies of the last token drafted per step (0: up to max_draft_len).",
    )
    fail_on_token: int | None = Field(
        default=None,
        description="For tests of failure isolation: drafting raises RuntimeError for a request whose tokens contain this id.",
    )
