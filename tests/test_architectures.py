"""Every supported architecture decodes exactly as transformers' own greedy ``generate``, and one
the KV cache cannot hold is refused when it loads.

The sliding-window models (Gemma 2, Gemma 3, Mistral with ``sliding_window``, gpt-oss) have a
window of 4 tokens: every prompt and output crosses it, and so does a verify step's chain of
drafts. They and DeepSeek-V3 (multi-head latent attention, whose cached keys and values differ in
size; dense and mixture-of-experts layers) are also tested with draft/target and draft trees.
EAGLE-3 on them is tested with the plugin (``plugins/eagle3/tests``).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import torch
import transformers

from specdec import LLM, SamplingParams
from specdec.errors import ModelLoadError
from specdec.runner import ModelRunner, tree_attention
from specdec.testing.architectures import FULL_ATTENTION, SLIDING_WINDOW, hf_greedy, make_tiny_model
from specdec.testing.tiny import TinyTarget

PROMPTS = ("hello world, hello", "abc", "one two three, one two three, one")
NEW_TOKENS = 30
#: Architectures tested with draft/target and with draft trees as well.
DRAFTED = (*SLIDING_WINDOW, "deepseek_v3")


@functools.cache
def _case(name: str, device: torch.device) -> tuple[TinyTarget, list[list[int]], list[list[int]]]:
    """The tiny model, the prompts' ids and transformers' greedy continuation of each, alone."""
    target = make_tiny_model(name, device=device)
    prompts = [target.encode(text) for text in PROMPTS]
    return target, prompts, hf_greedy(target, prompts, NEW_TOKENS)


def _assert_decodes_as_transformers(name: str, device: torch.device, config: object) -> int:
    """Alone and as one batch of ragged prompts, ``config`` gives transformers' greedy tokens;
    returns how many drafts were accepted in all."""
    target, prompts, expected = _case(name, device)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    accepted = 0
    for batch in (1, len(prompts)):
        with LLM(target.model, config, tokenizer=target.tokenizer, max_batch_size=batch) as llm:
            outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
        assert [o.token_ids for o in outputs] == expected, f"{name}, batch of {batch}"
        accepted += sum(o.metrics.num_accepted_tokens for o in outputs)
    return accepted


def _ngram() -> dict:
    return {"method": "ngram", "max_draft_len": 6, "max_matching_ngram_size": 2, "adaptive_draft_len": False}


@pytest.mark.parametrize("name", FULL_ATTENTION)
def test_full_attention_architectures_decode_as_transformers(name: str, device: torch.device) -> None:
    """Plain and n-gram decoding of the architectures whose layers all attend to the whole context."""
    _assert_decodes_as_transformers(name, device, None)
    _assert_decodes_as_transformers(name, device, _ngram())


@pytest.mark.parametrize("name", SLIDING_WINDOW)
def test_sliding_window_plain_decoding(name: str, device: torch.device) -> None:
    _assert_decodes_as_transformers(name, device, None)


@pytest.mark.parametrize("name", SLIDING_WINDOW)
def test_sliding_window_ngram_drafts_past_the_window(name: str, device: torch.device) -> None:
    """Chains of up to 6 drafts, longer than the window, are verified, accepted in part and rolled back."""
    assert _assert_decodes_as_transformers(name, device, _ngram()) > 0


@pytest.fixture(scope="module")
def draft_dirs(tmp_path_factory: pytest.TempPathFactory, device: torch.device) -> dict[str, Path]:
    """Per architecture of :data:`DRAFTED`, a draft model saved as a directory: the target with
    noise on its output layer, so it agrees with the target often but not always."""
    dirs = {}
    for name in DRAFTED:
        target, _, _ = _case(name, device)
        draft = copy.deepcopy(target.model)
        torch.manual_seed(1)
        with torch.no_grad():
            weight = draft.get_output_embeddings().weight
            weight.add_(torch.randn_like(weight) * weight.std() * 0.5)
        dirs[name] = tmp_path_factory.mktemp(f"draft-{name}")
        draft.save_pretrained(dirs[name])
        target.tokenizer.save_pretrained(dirs[name])
    return dirs


@pytest.mark.parametrize("name", DRAFTED)
def test_draft_target_of_the_same_architecture(name: str, device: torch.device, draft_dirs: dict[str, Path]) -> None:
    """A draft of the same architecture: both models' caches hold its layers and roll back."""
    config = {"method": "draft_target", "speculative_model": str(draft_dirs[name]), "max_draft_len": 5, "adaptive_draft_len": False}
    assert _assert_decodes_as_transformers(name, device, config) > 0


@pytest.mark.parametrize("name", DRAFTED)
def test_batched_tree_and_chain_rows_equal_a_forward_without_cache(name: str, device: torch.device) -> None:
    """A batch of a draft tree deeper than the window (of the sliding models) and a chain longer
    than it, over cached prompts longer than it: every tree node's logits are those of
    transformers' own forward over the node's path, without a cache (its own masks). After
    compacting the tree's accepted path and rolling back, the next forward still is. The tree
    alone, through :meth:`ModelRunner.forward` with :func:`tree_attention`'s mask, gets the same
    logits."""
    target, _, _ = _case(name, device)
    runner = ModelRunner(target.model)
    prompts = [list(range(3, 15)), list(range(10, 19))]
    # Row 0: root 20, then two branches deeper than the window of 4, whose nodes' flat indices run
    # ahead of their depths: 21-23-25-27 and 22-24-26-28-29.
    tree, parents = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [-1, 0, 0, 1, 2, 3, 4, 5, 6, 8]
    chain = [30, 31, 32, 33, 34, 35]
    cache = runner.new_cache(rows=0)
    for prompt in prompts:
        single = runner.new_cache()
        runner.forward(single, prompt)
        cache.append_rows(single)
    outputs = runner.forward_rows(cache, [tree, chain], parents=[parents, None])

    def reference(tokens: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return target.model(torch.tensor([tokens], device=device)).logits[0].float()

    for path in ([0, 1, 3, 5, 7], [0, 2, 4, 6, 8, 9]):
        expected = reference(prompts[0] + [tree[i] for i in path])[len(prompts[0]) :]
        torch.testing.assert_close(outputs[0].logits[path], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[1].logits, reference(prompts[1] + chain)[len(prompts[1]) :], atol=1e-5, rtol=1e-5)
    alone = runner.new_cache()
    runner.forward(alone, prompts[0])
    position_ids, mask = tree_attention(parents, len(prompts[0]), device)
    tree_alone = runner.forward(alone, tree, position_ids=position_ids, attention_mask=mask).logits
    torch.testing.assert_close(tree_alone, outputs[0].logits, atol=1e-5, rtol=1e-5)

    # Accept root -> 22 -> 24 -> 26 (row-local 0, 2, 4, 6) and 3 of the chain's tokens.
    start = len(prompts[0])
    cache.move_entries(0, [start + 2, start + 4, start + 6], start + 1)
    runner.rollback_rows(cache, [len(tree) - 4, len(chain) - 3])
    after = runner.forward_rows(cache, [[5, 6, 7, 8, 9], [11]])
    accepted = [prompts[0] + [20, 22, 24, 26], prompts[1] + chain[:3]]
    for out, done, new in zip(after, accepted, [[5, 6, 7, 8, 9], [11]]):
        torch.testing.assert_close(out.logits, reference(done + new)[len(done) :], atol=1e-5, rtol=1e-5)


def test_a_layer_type_the_cache_cannot_hold_is_refused_at_load() -> None:
    """Llama 4's chunked attention: one line naming the layer type, when the ``LLM`` is made."""
    config = transformers.Llama4TextConfig(
        hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=40, attention_chunk_size=8, num_local_experts=2,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ModelLoadError, match="chunked_attention") as refused:
        LLM(model, None, tokenizer=None)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("config", [
    transformers.RwkvConfig(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, vocab_size=40),
    transformers.xLSTMConfig(hidden_size=32, num_blocks=2, num_heads=4, vocab_size=40),
], ids=["rwkv", "xlstm"])
def test_a_model_with_a_recurrent_state_is_refused_at_load(config: transformers.PretrainedConfig) -> None:
    """RWKV and xLSTM keep a recurrent state, not a KV cache, and name no layer types: refused by
    transformers' ``_is_stateful`` mark (RWKV would otherwise decode wrongly, xLSTM fail mid-decoding)."""
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ModelLoadError, match="recurrent state") as refused:
        LLM(model, None, tokenizer=None)
    assert config.model_type in str(refused.value) and "\n" not in str(refused.value)
