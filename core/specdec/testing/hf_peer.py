"""What ``specdec bench --baseline hf`` passes to transformers' ``generate`` for a method."""

from __future__ import annotations

from typing import Any

from specdec.llm import LLM
from specdec.plugins import get_registry
from specdec.testing.tiny import TinyTarget


def hf_peer_kwargs(tiny: TinyTarget, config: Any) -> dict[str, Any] | None:
    """The ``specdec_hf_generate_kwargs`` answer for ``config`` on ``tiny``'s engine."""
    llm = LLM(tiny.model, config, tokenizer=tiny.tokenizer)
    try:
        return get_registry().hook.specdec_hf_generate_kwargs(config=llm.speculative_config, target=llm.engine.target)
    finally:
        llm.close()
