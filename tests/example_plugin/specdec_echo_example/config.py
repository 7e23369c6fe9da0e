"""The echo method's options: the shared ones plus ``repeat``."""

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
