"""Hook specifications: the whole contract between the specdec core and a method plugin.

A plugin is a module or object with functions decorated by ``@specdec.hookimpl`` whose names and
arguments match the specs below (an implementation may take fewer arguments than the spec).
Hooks are grouped by lifecycle phase: registration once per process, resources once per
``LLM``, then per decoding step ``prepare_draft_tokens`` -> target forward (core) -> ``verify`` ->
``accept``.

Every per-method hook receives the active ``config`` (an instance of a
:class:`~specdec.config.SpeculativeConfig` subclass). An implementation that does not own that
config returns ``None`` (``firstresult`` hooks) or does nothing, so one process can host many
methods. The core's default ``verify`` and ``resource_manager`` are registered with
``trylast=True``; a plugin overrides them simply by returning a result for its config.

``specdec_logits_processors`` is not per method: any plugin may add processors to any request,
whatever method runs.

Per-step hooks take *lists* of requests: the engine may run several requests in one step, and a
method must treat each request independently (its own drafts, its own acceptance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    import torch

    from specdec.config import SpeculativeConfig
    from specdec.logits_processing import LogitsProcessor
    from specdec.requests import DraftProposal, Request, VerifyResult
    from specdec.resources import ResourceManager, TargetContext
    from specdec.sampling import SamplingParams

PROJECT_NAME = "specdec"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -- registration ------------------------------------------------------------------------------


@hookspec
def specdec_register_methods(register: Callable[..., None]) -> None:
    """Declare the speculation methods this plugin provides.

    Called once when plugins load. Call ``register`` once per method::

        register(name, config_class, aliases=(), summary="")

    :param register: ``name`` (str) is the canonical method name, as written in
        ``decoding_type`` / ``method``; ``config_class`` is the method's pydantic config, a
        subclass of :class:`~specdec.config.SpeculativeConfig`; ``aliases`` are other names
        users write (matching ignores case, ``-`` and ``_``); ``summary`` is one line for
        ``specdec list-methods``.
    :return: nothing.
    """


# -- session resources -------------------------------------------------------------------------


@hookspec(firstresult=True)
def specdec_resource_manager(
    config: SpeculativeConfig, target: TargetContext
) -> ResourceManager | None:
    """Create the per-session state a method needs (draft model, n-gram pool, head weights).

    Called once when an ``LLM`` is built with ``config``. The engine calls the returned object's
    ``add_request`` / ``free_request`` as requests start and finish, and ``release`` once when
    the ``LLM`` is closed.

    :param config: the active speculative config.
    :param target: the loaded target model, its tokenizer, device and dtype.
    :return: a :class:`~specdec.resources.ResourceManager`, or ``None`` if ``config`` is not
        this plugin's. Stops at the first non-``None`` result; the core default returns an
        empty manager.
    """


# -- per step ----------------------------------------------------------------------------------


@hookspec(firstresult=True)
def specdec_prepare_draft_tokens(
    config: SpeculativeConfig,
    requests: list[Request],
    resource_manager: ResourceManager,
) -> list[DraftProposal] | None:
    """Propose draft tokens for each request of this step.

    :param config: the active speculative config.
    :param requests: the running requests; ``request.token_ids`` holds prompt and output so far
        (its last token is the one the target forwards next), ``request.max_draft_len`` caps
        the proposal for this step (already limited by the remaining token budget). It is 0
        where drafting is paused or, with ``use_sa_spec``, where the request takes a suffix
        draft this step: :func:`specdec_accept` then reports drafts the method did not propose.
    :param resource_manager: the object ``specdec_resource_manager`` returned.
    :return: one :class:`~specdec.requests.DraftProposal` per request, in order (an empty
        proposal means "decode plainly this step"), or ``None`` if ``config`` is not this
        plugin's. Stops at the first non-``None`` result.
    """


@hookspec(firstresult=True)
def specdec_verify(
    config: SpeculativeConfig,
    requests: list[Request],
    proposals: list[DraftProposal],
    target_logits: list[torch.Tensor],
) -> list[VerifyResult] | None:
    """Decide how many drafts each request keeps, and its next (bonus or recovered) token.

    The core default (registered ``trylast``) does exact greedy matching when the request's
    temperature is 0 and standard rejection sampling otherwise; both are lossless. Override
    only for a different acceptance rule (Medusa's typical acceptance, MTP's relaxed one).

    :param config: the active speculative config.
    :param requests: the running requests.
    :param proposals: what ``specdec_prepare_draft_tokens`` returned, one per request.
    :param target_logits: per request, float logits of shape ``[len(drafts) + 1, vocab]``;
        row ``i`` is the target's prediction after the request's last token and drafts
        ``0..i-1``.
    :return: one :class:`~specdec.requests.VerifyResult` per request, or ``None`` to leave the
        decision to the next implementation. Stops at the first non-``None`` result.
    """


@hookspec
def specdec_accept(
    config: SpeculativeConfig,
    requests: list[Request],
    results: list[VerifyResult],
    resource_manager: ResourceManager,
) -> None:
    """Commit a step: update drafter state with the tokens each request kept.

    Called after the core has appended the new tokens to ``request.token_ids`` (cut at any stop
    condition) and rolled back the target's KV cache. A drafter updates its own state here
    (n-gram pool insert, draft-model KV crop). Every implementation is called; one that does
    not own ``config`` does nothing.

    :param config: the active speculative config.
    :param requests: the requests of this step, tokens already appended.
    :param results: the verification results, one per request.
    :param resource_manager: the object ``specdec_resource_manager`` returned.
    :return: nothing.
    """


# -- logits processing -------------------------------------------------------------------------


@hookspec
def specdec_logits_processors(params: SamplingParams, target: TargetContext) -> list[LogitsProcessor] | None:
    """Logits processors of the plugin's own for one new request.

    Called for every request as it is added, for every plugin (not only the active method's).
    A plugin reads its per-request arguments from ``params.extra_args`` (vLLM's name) and returns
    ``None`` or ``[]`` for requests that do not ask for it. Each processor is a fresh
    :class:`~specdec.logits_processing.LogitsProcessor` for that request: ``apply`` changes the
    target's logits of each verify row from that row's own prefix, so speculative output stays
    what plain decoding with the processor gives. The plugin's processors run after the
    built-in ones (grammar, bad words, ``logit_bias``, ``min_tokens``, penalties).

    An exception here fails the request with a ``PluginError`` naming the plugin; one raised by a
    processor during decoding ends only its request (``finish_reason="error"``).

    :param params: the request's sampling parameters.
    :param target: the loaded target model (its tokenizer, vocabulary size and device).
    :return: the processors for this request, or ``None``.
    """


# -- benchmarking ------------------------------------------------------------------------------


@hookspec(firstresult=True)
def specdec_hf_generate_kwargs(config: SpeculativeConfig, target: TargetContext) -> dict[str, Any] | None:
    """Keyword arguments that make ``transformers``' ``generate`` run this method's peer.

    ``specdec bench --baseline hf`` runs ``model.generate(**kwargs)`` beside specdec, e.g.
    ``{"prompt_lookup_num_tokens": 4}`` for n-gram or ``{"assistant_model": model}`` for a draft
    model.

    :param config: the active speculative config.
    :param target: the loaded target model.
    :return: the extra ``generate`` kwargs, or ``None`` if ``config`` is not this plugin's (or
        transformers has no equivalent). Stops at the first non-``None`` result.
    """


# -- command line ------------------------------------------------------------------------------


@hookspec
def specdec_train_commands() -> list[click.Command]:
    """Commands this plugin adds under ``specdec train`` (e.g. ``specdec train draft``).

    Called when the ``train`` group lists or runs its commands. Every implementation is called
    and the lists are joined; a command's name must be unique across plugins.

    :return: ``click`` commands; each becomes ``specdec train <name>``.
    """
