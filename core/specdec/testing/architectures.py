"""Tiny random models of the architectures specdec supports, over the tiny tokenizer's vocabulary.

Each is two layers of width 32, fp32, built in-process. The sliding-window architectures get a
window of ``window`` tokens, small enough that prompts, outputs and a verify step's drafts cross
it; Gemma 2 and 3 and gpt-oss alternate sliding and full-attention layers, Mistral slides in
every layer. DeepSeek-V3 has a dense layer then a mixture-of-experts one, and multi-head latent
attention whose keys (12 wide) and values (8 wide) differ in head size, as do the latents its
cache holds (16 and 4).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from specdec.testing.tiny import TinyTarget, tiny_tokenizer

#: Architectures whose layers all attend to the whole context.
FULL_ATTENTION = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gpt2", "gpt_neox", "olmo2", "granite", "deepseek_v3",
                  "deepseek_v3_yarn")
#: Architectures with sliding-window attention layers.
SLIDING_WINDOW = ("gemma2", "gemma3", "mistral_sliding", "gpt_oss")

_SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
_ALTERNATING = ["sliding_attention", "full_attention"]
#: Multi-head latent attention with key head size 8 + 4 and value head size 8, one key/value head
#: per query head (the class's default ``num_key_value_heads`` is DeepSeek-V3's 128); layer 0
#: dense, layer 1 four routed experts (two per token, in one group) and a shared one.
_DEEPSEEK_V3 = dict(
    num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
    first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
    moe_intermediate_size=16,
)


def _config(name: str, window: int) -> Any:
    """The architecture's config, before the fields every tiny model shares."""
    if name == "gpt2":
        return transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_inner=64)
    sliding = {"head_dim": 8, "sliding_window": window, "layer_types": _ALTERNATING}
    classes_and_fields: dict[str, tuple[type, dict[str, Any]]] = {
        "llama": (transformers.LlamaConfig, {}),
        "qwen2": (transformers.Qwen2Config, {}),
        "qwen3": (transformers.Qwen3Config, {"head_dim": 8}),
        "mistral": (transformers.MistralConfig, {"sliding_window": None}),
        "phi3": (transformers.Phi3Config, {}),
        "gpt_neox": (transformers.GPTNeoXConfig, {}),
        "olmo2": (transformers.Olmo2Config, {}),
        "granite": (transformers.GraniteConfig, {}),
        "deepseek_v3": (transformers.DeepseekV3Config, _DEEPSEEK_V3),
        # DeepSeek-V3's own RoPE: YaRN, 4x past 64 positions, with its attention-scale correction.
        "deepseek_v3_yarn": (transformers.DeepseekV3Config, {**_DEEPSEEK_V3, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}, "max_position_embeddings": 256}),
        "gemma2": (transformers.Gemma2Config, sliding),
        "gemma3": (transformers.Gemma3TextConfig, sliding),
        "mistral_sliding": (transformers.MistralConfig, {"sliding_window": window}),
        # Four experts, two per token; plain RoPE (its default YaRN scaling assumes a long context).
        "gpt_oss": (transformers.GptOssConfig, {**sliding, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    }
    config_class, fields = classes_and_fields[name]
    return config_class(**{**_SIZES, **fields})


def make_tiny_model(
    name: str, seed: int = 0, window: int = 4, sharpness: float = 4.0, device: str | torch.device = "cpu"
) -> TinyTarget:
    """A random fp32 model of architecture ``name`` (one of :data:`FULL_ATTENTION` and
    :data:`SLIDING_WINDOW`) with the tiny tokenizer, on ``device`` (weights drawn on the CPU);
    ``sharpness`` scales its output layer, as :func:`~specdec.testing.make_tiny_target` does, so
    its next-token distributions are peaked."""
    tokenizer = tiny_tokenizer()
    config = _config(name, window)
    config.vocab_size = len(tokenizer)
    config.max_position_embeddings = 256
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    config.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpness)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return TinyTarget(model.to(device), tokenizer)


def hf_greedy(target: TinyTarget, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' own greedy continuation of each prompt, alone, ``new_tokens`` long
    (``eos_token_id=None``: the full length, as ``ignore_eos`` runs specdec)."""
    device = target.model.device
    with torch.inference_mode():
        return [
            target.model.generate(
                torch.tensor([ids], device=device), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None
            )[0, len(ids) :].tolist()
            for ids in prompts
        ]
