"""specdec: lossless speculative decoding for Hugging Face transformers models.

This module is the public API: what applications use (``LLM``, ``SamplingParams``) and everything
a method plugin may import from the core at run time (hooks, requests, resources, the runner, KV
caches, trees, verification, draft vocabularies, model loading). A plugin's trainer adds
``specdec.training``; tests add ``specdec.testing``. CI checks with import-linter that plugins
import nothing else from the core and never each other (docs/writing-a-plugin.md)."""

from specdec.attention import grouped_query_attention
from specdec.builtin.user_provided import UserProvidedDecodingConfig
from specdec.config import DraftingConfig, PlainDecodingConfig, SpeculativeConfig
from specdec.draft_pick import pick_drafts
from specdec.draft_vocab import (DraftVocabularyConfig, compact_token_ids, draft_ranking, draft_vocabulary, full_logits, kept_rows,
                                 trim_output_layer, trimmed_projection)
from specdec.errors import (ConfigError, ModelLoadError, PluginError, QueueFullError, RequestFailedError, SpecdecError,
                            UnknownMethodError)
from specdec.hidden_states import HiddenStates
from specdec.hookspecs import hookimpl
from specdec.kv_cache import BatchKVCache, RaggedDraftBatch, RequestKV
from specdec.llm import LLM, RequestOutput
from specdec.logits_processing import LogitsProcessor, VerifyRows
from specdec.metrics import RequestMetrics
from specdec.models import (DEFAULT_MODEL, cache_dir, default_model_dir, drafter_checkpoint, is_default_model, load_model,
                            resolve_device, resolve_dtype)
from specdec.prepacked_linear import prepack_linears
from specdec.progress import Progress
from specdec.requests import DraftProposal, Request, RequestDelta, VerifyResult
from specdec.resources import HiddenStateResources, LastStateResources, ResourceManager, TargetContext
from specdec.runner import ModelRunner, cache_keyword
from specdec.sampling import SamplingParams, greedy_tokens, logits_to_probs
from specdec.setup_time import SetupClock, catch_up
from specdec.static_draft import RecordedCalls, StaticDraftCache
from specdec.structured_outputs import GuidedDecodingParams, StructuredOutputsParams
from specdec.suffix import SUFFIX_DEFAULTS, SuffixCache
from specdec.trees import DraftTree, TreeCandidates, node_depths, parents_of_paths, path_to
from specdec.verify import verify_requests

__all__ = [
    "BatchKVCache",
    "ConfigError",
    "DEFAULT_MODEL",
    "DraftProposal",
    "DraftTree",
    "DraftVocabularyConfig",
    "DraftingConfig",
    "GuidedDecodingParams",
    "HiddenStateResources",
    "HiddenStates",
    "LLM",
    "LastStateResources",
    "LogitsProcessor",
    "ModelLoadError",
    "ModelRunner",
    "PlainDecodingConfig",
    "PluginError",
    "Progress",
    "QueueFullError",
    "RaggedDraftBatch",
    "RecordedCalls",
    "Request",
    "RequestDelta",
    "RequestFailedError",
    "RequestKV",
    "RequestMetrics",
    "RequestOutput",
    "ResourceManager",
    "SUFFIX_DEFAULTS",
    "SamplingParams",
    "SetupClock",
    "SpecdecError",
    "SpeculativeConfig",
    "StaticDraftCache",
    "StructuredOutputsParams",
    "SuffixCache",
    "TargetContext",
    "TreeCandidates",
    "UnknownMethodError",
    "UserProvidedDecodingConfig",
    "VerifyResult",
    "VerifyRows",
    "cache_dir",
    "cache_keyword",
    "catch_up",
    "compact_token_ids",
    "default_model_dir",
    "draft_ranking",
    "draft_vocabulary",
    "drafter_checkpoint",
    "full_logits",
    "greedy_tokens",
    "grouped_query_attention",
    "hookimpl",
    "is_default_model",
    "kept_rows",
    "load_model",
    "logits_to_probs",
    "node_depths",
    "parents_of_paths",
    "path_to",
    "pick_drafts",
    "prepack_linears",
    "resolve_device",
    "resolve_dtype",
    "trim_output_layer",
    "trimmed_projection",
    "verify_requests",
]
