"""vLLM's ``/tokenize`` and ``/detokenize``: the token ids a prompt or a conversation prefills
(what agents count their context with), and the text of token ids, from the served tokenizer."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from specdec.server.errors import APIError
from specdec.server.protocol import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    parse,
)
from specdec.server.state import ServerState


def tokenize_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        raw = await request.body()
        chat = _names_messages(raw)
        body = parse(TokenizeChatRequest if chat else TokenizeCompletionRequest, raw)
        state.check_model(body.model)
        if chat:
            ids, _ = state.encode_conversation(body)
        else:
            ids = state.encode_text(body.prompt, add_special_tokens=body.add_special_tokens)
        strs = state.llm.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": state.max_length, "tokens": ids, "token_strs": strs}

    @router.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body: DetokenizeRequest = parse(DetokenizeRequest, await request.body())
        state.check_model(body.model)
        vocab = len(state.llm.tokenizer)
        outside = [t for t in body.tokens if not 0 <= t < vocab]
        if outside:
            raise APIError(400, f"tokens: {outside[0]} is not a token id of this model (0 to {vocab - 1})", "tokens")
        return {"prompt": state.llm.tokenizer.decode(body.tokens)}

    return router


def _names_messages(raw: bytes) -> bool:
    """Whether a ``/tokenize`` body is a conversation (it has ``messages``); invalid JSON is left
    for the parser to refuse."""
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) and "messages" in value
