"""DeepSeek-V3 in the core runner: multi-head latent attention caches a compressed latent as its
keys and the shared rotary key as its values, of different sizes (16 and 4 in the tiny model).

Decoding it as transformers does, with every method, is tested with the other architectures
(``tests/test_architectures.py``, ``plugins/eagle3/tests/test_eagle3_deepseek_v3.py``); these
tests cover the cache itself and the command that used to fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from specdec.cli.main import main
from specdec.runner import ModelRunner
from specdec.testing.architectures import hf_greedy, make_tiny_model
from specdec.testing.tiny import TinyTarget


@pytest.fixture(scope="module")
def deepseek(device: torch.device) -> TinyTarget:
    return make_tiny_model("deepseek_v3", device=device)


def test_generate_with_method_none_decodes_as_transformers(
    deepseek: TinyTarget, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specdec generate --method none`` on a saved DeepSeek-V3 model: it failed inside the KV
    cache, which shaped the values' buffer like the keys', with "The expanded size of the tensor
    (16) must match the existing size (4)" (the latent and the rotary key's sizes)."""
    deepseek.model.save_pretrained(tmp_path)
    deepseek.tokenizer.save_pretrained(tmp_path)
    args = ["generate", "--model", str(tmp_path), "--dtype", "float32", "--device", "cpu", "--method", "none",
            "--no-chat", "--max-tokens", "20", "--json", "hello world, hello"]
    assert main(args) == 0
    tokens = json.loads(capsys.readouterr().out)["token_ids"]
    expected = hf_greedy(TinyTarget(deepseek.model.cpu(), deepseek.tokenizer), [deepseek.encode("hello world, hello")], 20)[0]
    assert tokens and tokens == expected[: len(tokens)]
    assert len(tokens) == 20 or tokens[-1] == deepseek.tokenizer.eos_token_id


def test_keys_and_values_of_different_sizes_match_a_dynamic_cache(deepseek: TinyTarget) -> None:
    """Each layer's key and value buffers keep their own shapes, and a prefill then verify-sized
    steps with rollbacks give transformers' ``DynamicCache``'s logits exactly."""
    runner = ModelRunner(deepseek.model)
    ids = list(range(3, 33)) * 4
    ours, theirs = runner.new_cache(), DynamicCache(config=deepseek.model.config)
    assert torch.equal(runner.forward(ours, ids[:40]).logits, runner.forward(theirs, ids[:40]).logits)
    for step in range(10):
        window = ids[40 + step : 45 + step]
        assert torch.equal(runner.forward(ours, window).logits, runner.forward(theirs, window).logits), step
        runner.rollback(ours, 4)
        runner.rollback(theirs, 4)
    config = deepseek.model.config
    for layer in ours.layers:
        assert layer.keys.shape[-1] == config.kv_lora_rank and layer.values.shape[-1] == config.qk_rope_head_dim
        assert layer.keys.shape[:-1] == layer.values.shape[:-1]


def test_rows_of_different_lengths_join_leave_and_replace(deepseek: TinyTarget) -> None:
    """Ragged rows of a batch, a row replaced by a newcomer and rows leaving: every row's logits
    stay those of its request run alone (the key and value buffers joined and copied separately)."""
    runner = ModelRunner(deepseek.model)
    prompts = [list(range(3, 20)), list(range(10, 15)), list(range(5, 35))]
    batch, alone = runner.new_cache(rows=0), []
    for prompt in prompts:
        single = runner.new_cache()
        runner.forward(single, prompt)
        batch.append_rows(single)
        alone.append(runner.new_cache())
        runner.forward(alone[-1], prompt)
    newcomer = [20, 21, 22, 23]
    alone[1] = runner.new_cache()
    runner.forward(alone[1], newcomer)
    joining = runner.new_cache()
    runner.forward(joining, newcomer)
    batch.replace_row(1, joining)
    batch.select_rows([2, 1, 0])
    alone = [alone[2], alone[1], alone[0]]
    rows = [[7, 8, 9], [4], [11, 12]]
    for out, cache, row in zip(runner.forward_rows(batch, rows), alone, rows, strict=True):
        torch.testing.assert_close(out.logits, runner.forward(cache, row).logits, atol=1e-5, rtol=1e-5)
