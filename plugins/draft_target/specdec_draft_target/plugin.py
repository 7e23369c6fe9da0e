"""specdec hook implementations for draft/target speculation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from specdec import (
    ConfigError,
    DraftProposal,
    Request,
    ResourceManager,
    SpeculativeConfig,
    TargetContext,
    draft_vocabulary,
    hookimpl,
    is_default_model,
    load_model,
)
from specdec_draft_target.config import DraftTargetDecodingConfig
from specdec_draft_target.drafter import DraftModel
from specdec_draft_target.shipped import shipped_draft_dir
from specdec_draft_target.vocab import check_same_tokenizer


def load_draft(config: DraftTargetDecodingConfig, target: TargetContext) -> Any:
    """The draft model named by ``config`` (or the shipped one), on the target's device and dtype."""
    name = config.speculative_model
    if name is None:
        if not is_default_model(target.model):
            raise ConfigError(
                "speculative_model: required; a draft ships only for the default target (SmolLM2-135M-Instruct)"
            )
        path, name = str(shipped_draft_dir()), "shipped SmolLM2 draft"
    else:
        path = name
    model, tokenizer = load_model(path, target.dtype, target.device)
    check_same_tokenizer(tokenizer, target.tokenizer, int(model.get_output_embeddings().weight.shape[0]),
                         target.vocab_size, name)
    return model


def mask_token(config: DraftTargetDecodingConfig, model: Any) -> int | None:
    """The draft's PARD mask token when it drafts in parallel (``parallel_drafting``), else ``None``."""
    token = getattr(model.config, "pard_token", None)
    if config.parallel_drafting is False:
        return None
    if token is None:
        if config.parallel_drafting:
            raise ConfigError("parallel_drafting: the draft model is not a PARD draft (its config.json has no pard_token)")
        return None
    size = int(model.get_input_embeddings().weight.shape[0])
    if not isinstance(token, int) or not 0 <= token < size:
        raise ConfigError(f"parallel_drafting: the draft's pard_token {token!r} is not a token id below its vocabulary size {size}")
    return token


class DraftTargetResources(ResourceManager):
    """The draft model and its batched KV cache; each request's place in it is ``request.method_state``."""

    def __init__(self, drafter: DraftModel) -> None:
        super().__init__()
        self.drafter: DraftModel | None = drafter
        self.setup_clock = drafter.setup_clock
        # A PARD draft proposes a step's tokens in one forward, whatever their number.
        self.draft_cost_per_token = drafter.mask_token is None

    def add_request(self, request: Request) -> None:
        request.method_state = self.drafter.add(request)

    def free_request(self, request: Request) -> None:
        request.method_state = None
        self.drafter.free(request)

    def release(self) -> None:
        self.drafter.release()
        self.drafter = None
        super().release()


@hookimpl
def specdec_register_methods(register: Callable[..., None]) -> None:
    register(
        "draft_target",
        DraftTargetDecodingConfig,
        aliases=("DraftTarget", "Draft_Target", "draft_model"),
        summary="A smaller model with the target's tokenizer drafts a chain of tokens (ships a SmolLM2 draft).",
    )


@hookimpl
def specdec_resource_manager(config: SpeculativeConfig, target: TargetContext) -> ResourceManager | None:
    if not isinstance(config, DraftTargetDecodingConfig):
        return None
    model = load_draft(config, target)
    drafter = DraftModel(model, target.vocab_size, config.confidence_threshold,
                         draft_vocabulary(config, target, shipped=config.speculative_model is None),
                         target.runner.execution, target.max_batch_size, target.runner.max_length,
                         mask_token(config, model), config.max_draft_len)
    return DraftTargetResources(drafter)


@hookimpl
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig, requests: list[Request], resource_manager: DraftTargetResources
) -> list[DraftProposal] | None:
    if not isinstance(config, DraftTargetDecodingConfig):
        return None
    return resource_manager.drafter.propose(requests)


@hookimpl
def specdec_hf_generate_kwargs(config: SpeculativeConfig, target: TargetContext) -> dict[str, Any] | None:
    if not isinstance(config, DraftTargetDecodingConfig):
        return None
    assistant = load_draft(config, target)
    # A fixed draft length, as specdec's: transformers' default schedule adapts it.
    assistant.generation_config.num_assistant_tokens = config.max_draft_len
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    # The same early stop as specdec's. 0 turns it off; None would not: transformers fills None
    # with its default of 0.4. Without scikit-learn transformers keeps the threshold fixed; with
    # it, a non-zero threshold is re-fitted once more than five drafts were judged, some accepted
    # and some not, and the two early stops part.
    assistant.generation_config.assistant_confidence_threshold = config.confidence_threshold
    return {"assistant_model": assistant}


@hookimpl
def specdec_train_commands() -> list[click.Command]:
    from specdec_draft_target.train import train_draft
    from specdec_draft_target.train_pard import train_pard

    return [train_draft, train_pard]
