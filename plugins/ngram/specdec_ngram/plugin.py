"""specdec hook implementations for the n-gram method."""

from __future__ import annotations

from collections.abc import Callable

from specdec import (
    DraftProposal,
    Request,
    ResourceManager,
    SpeculativeConfig,
    TargetContext,
    VerifyResult,
    hookimpl,
)
from specdec_ngram.config import NGramDecodingConfig
from specdec_ngram.pool import NGramPool


class NGramResources(ResourceManager):
    """One pool per request, or one public pool shared by all (``is_public_pool``)."""

    def __init__(self, config: NGramDecodingConfig) -> None:
        super().__init__()
        self.config = config
        self.public_pool = self._new_pool(config.max_cached_requests) if config.is_public_pool else None

    def _new_pool(self, max_cached_sequences: int | None = None) -> NGramPool:
        c = self.config
        return NGramPool(
            c.prompt_lookup_min, c.max_matching_ngram_size, c.is_keep_all, c.is_use_oldest, c.max_draft_len,
            max_cached_sequences,
        )

    def pool(self, request: Request) -> NGramPool:
        return self.public_pool if self.public_pool is not None else request.method_state

    def add_request(self, request: Request) -> None:
        if self.public_pool is None:
            request.method_state = self._new_pool()
        self.pool(request).update(request.request_id, request.token_ids)

    def free_request(self, request: Request) -> None:
        if self.public_pool is not None:
            self.public_pool.forget(request.request_id)
        request.method_state = None

    def release(self) -> None:
        self.public_pool = None
        super().release()

    def forget_finished(self) -> None:
        if self.public_pool is not None:
            self.public_pool.forget_finished()


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "ngram",
        NGramDecodingConfig,
        aliases=("NGram", "prompt_lookup", "ngram_proposer"),
        summary="Prompt lookup: drafts what followed the last n-gram earlier in the context.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return NGramResources(config) if isinstance(config, NGramDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: NGramResources
) -> list[DraftProposal] | None:
    if not isinstance(config, NGramDecodingConfig):
        return None
    return [
        DraftProposal(resource_manager.pool(r).propose(r.token_ids, r.max_draft_len)) for r in requests
    ]


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: NGramResources
) -> None:
    if isinstance(config, NGramDecodingConfig):
        for request in requests:
            resource_manager.pool(request).update(request.request_id, request.token_ids)


@hookimpl
def specdec_hf_generate_kwargs(config: SpeculativeConfig) -> dict[str, int] | None:
    if not isinstance(config, NGramDecodingConfig):
        return None
    return {"prompt_lookup_num_tokens": config.max_draft_len, "max_matching_ngram_size": config.max_matching_ngram_size}
