"""specdec: lossless speculative decoding for Hugging Face transformers models."""

from specdec.attention import grouped_query_attention
from specdec.builtin.user_provided import UserProvidedDecodingConfig
from specdec.config import DraftingConfig, PlainDecodingConfig, SpeculativeConfig
from specdec.draft_pick import pick_drafts
from specdec.draft_vocab import DraftVocabularyConfig, draft_vocabulary
from specdec.errors import ConfigError, PluginError, QueueFullError, RequestFailedError, SpecdecError, UnknownMethodError
from specdec.hookspecs import hookimpl
from specdec.llm import LLM, RequestOutput
from specdec.metrics import RequestMetrics
from specdec.prepacked_linear import prepack_linears
from specdec.requests import DraftProposal, Request, RequestDelta, VerifyResult
from specdec.resources import HiddenStateResources, ResourceManager, TargetContext
from specdec.sampling import SamplingParams, greedy_tokens, logits_to_probs

__all__ = [
    "ConfigError",
    "DraftProposal",
    "DraftVocabularyConfig",
    "DraftingConfig",
    "HiddenStateResources",
    "LLM",
    "PlainDecodingConfig",
    "PluginError",
    "QueueFullError",
    "Request",
    "RequestDelta",
    "RequestFailedError",
    "RequestMetrics",
    "RequestOutput",
    "ResourceManager",
    "SamplingParams",
    "SpecdecError",
    "SpeculativeConfig",
    "TargetContext",
    "UnknownMethodError",
    "UserProvidedDecodingConfig",
    "VerifyResult",
    "draft_vocabulary",
    "greedy_tokens",
    "grouped_query_attention",
    "hookimpl",
    "logits_to_probs",
    "pick_drafts",
    "prepack_linears",
]
