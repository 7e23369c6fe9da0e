"""specdec hook implementations for suffix decoding."""

from __future__ import annotations

from collections.abc import Callable

from specdec import (
    DraftProposal,
    Request,
    ResourceManager,
    SpeculativeConfig,
    SuffixCache,
    TargetContext,
    VerifyResult,
    hookimpl,
)
from specdec_suffix.config import SuffixDecodingConfig

#: Draft tokens of transformers' prompt lookup as its documentation runs it.
HF_PROMPT_LOOKUP_TOKENS = 10


class SuffixResources(ResourceManager):
    """The requests' trees and the global tree (:class:`SuffixCache`), kept until the LLM closes."""

    def __init__(self, config: SuffixDecodingConfig) -> None:
        super().__init__()
        self.config = config
        self.cache: SuffixCache | None = SuffixCache(config.suffix_decoding_max_tree_depth,
                                                     config.suffix_decoding_max_cached_requests,
                                                     config.suffix_decoding_max_cached_tokens)

    def add_request(self, request: Request) -> None:
        self.cache.start(request.request_id, request.token_ids[: request.num_prompt_tokens])
        self.cache.extend(request.request_id, request.token_ids, request.num_prompt_tokens)

    def free_request(self, request: Request) -> None:
        self.cache.stop(request.request_id)

    def release(self) -> None:
        self.cache = None
        super().release()

    def forget_finished(self) -> None:
        self.cache.forget_finished()

    def propose(self, request: Request) -> DraftProposal:
        c = self.config
        tree = c.suffix_decoding_tree_spec
        draft = self.cache.speculate(request.request_id, request.token_ids, request.max_draft_len,
                                     c.suffix_decoding_max_spec_factor, c.suffix_decoding_max_spec_offset,
                                     c.suffix_decoding_min_token_prob, tree)
        return DraftProposal(draft.token_ids, parents=draft.parents if tree else None)


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "suffix",
        SuffixDecodingConfig,
        aliases=("Suffix", "suffix_decoding"),
        summary="Suffix decoding: drafts what followed the longest matching suffix in the request and recent outputs.",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    return SuffixResources(config) if isinstance(config, SuffixDecodingConfig) else None


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: SuffixResources
) -> list[DraftProposal] | None:
    if not isinstance(config, SuffixDecodingConfig):
        return None
    return [resource_manager.propose(r) for r in requests]


@hookimpl
def specdec_accept(
    config: SpeculativeConfig, requests: list[Request], results: list[VerifyResult], resource_manager: SuffixResources
) -> None:
    if isinstance(config, SuffixDecodingConfig):
        for request in requests:
            resource_manager.cache.extend(request.request_id, request.token_ids, request.num_prompt_tokens)


@hookimpl
def specdec_hf_generate_kwargs(config: SpeculativeConfig) -> dict[str, int] | None:
    """transformers has no suffix decoding; its peer is prompt lookup, which also drafts what
    followed a matching suffix (of the prompt and output only, up to 10 tokens as its docs run it,
    never more than this config drafts)."""
    if not isinstance(config, SuffixDecodingConfig):
        return None
    return {"prompt_lookup_num_tokens": min(config.max_draft_len, HF_PROMPT_LOOKUP_TOKENS)}
