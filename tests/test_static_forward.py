"""The static-shape forward path (specdec.static_forward, specdec.static_cache) against the eager
runner: same logits (float32, 1e-5) for ragged batches, trees, rollbacks and rows joining and
leaving, on full-attention, sliding-window and DeepSeek-V3 models; the bucketing; the switch.

``static`` runs the bucketed, padded forward without capture, so everything but the recording
itself is checked on the CPU; on CUDA (``SPECDEC_TEST_DEVICE=cuda``) the same tests run the
captured graphs (``cuda_graph``).
"""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams, static_forward
from specdec.errors import ConfigError
from specdec.kv_cache import KEY_BLOCK, KEY_SPLIT
from specdec.runner import ModelRunner
from specdec.static_cache import StaticKVCache
from specdec.static_forward import batch_buckets, bucket_for, resolve_execution, use_recordable_experts, width_buckets
from specdec.testing import TinyTarget, prefilled_batch
from specdec.testing.architectures import make_tiny_model
from specdec.testing.recording import emulate_cuda_graphs


@pytest.fixture
def modes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The static path unrecorded, and captured: as CUDA graphs on CUDA, emulated elsewhere."""
    emulate_cuda_graphs(monkeypatch)
    return ["static", "cuda_graph"]


def _replay(runner: ModelRunner, cache, script: list) -> list[torch.Tensor]:
    """Run ``script`` (forwards, rollbacks, rows leaving and joining) on ``cache``; every logit."""
    logits = []
    for op, *args in script:
        if op == "rows":
            outputs = runner.forward_rows(cache, *args)
            logits.extend(o.logits for o in outputs)
        elif op == "rollback":
            runner.rollback_rows(cache, args[0])
        elif op == "select":
            cache.select_rows(args[0])
        elif op == "join":
            joining = []
            for prompt in args[0]:
                row = runner.new_cache()
                logits.append(runner.forward(row, prompt, last_only=True).logits)
                joining.append(row)
            cache.append_rows(*joining)
        elif op == "replace":
            row_index, prompt = args
            row = runner.new_cache()
            logits.append(runner.forward(row, prompt, last_only=True).logits)
            cache.replace_row(row_index, row)
        elif op == "move":
            cache.move_entries(*args)
    return logits


def _assert_static_equals_eager(target: TinyTarget, script: list, modes: list[str], max_rows: int, max_width: int) -> list[ModelRunner]:
    """Replay ``script`` on the eager runner and on a static runner per mode: the same logits
    everywhere (float32, 1e-5). Returns the static runners."""
    eager = ModelRunner(target.model)
    expected = _replay(eager, eager.new_batch_cache(), script)
    runners = []
    for mode in modes:
        runner = ModelRunner(target.model, execution=mode)
        runner.prepare(max_rows=max_rows, max_width=max_width)
        got = _replay(runner, runner.new_batch_cache(), script)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        runners.append(runner)
    return runners


#: Three requests join, decode ragged chains and a tree, roll back, one leaves, one takes its row.
SCRIPT = [
    ("join", [list(range(3, 12)), list(range(20, 26)), list(range(5, 20))]),
    ("rows", [[5], [6, 7, 8], [9, 10]]),
    ("rollback", [0, 2, 1]),
    ("rows", [[11, 12, 13, 14], [15], [16, 17]], [[-1, 0, 0, 1], None, None]),
    ("move", 0, [12, 14], 11),
    ("rollback", [2, 0, 0]),
    ("select", [0, 2]),
    ("rows", [[18, 19], [20]]),
    ("replace", 1, list(range(25, 32))),
    ("join", [[3, 4, 5]]),
    ("rows", [[21], [22, 23, 24, 25, 26], [27]]),
    ("rollback", [0, 3, 0]),
    ("rows", [[28, 29], [30], [31, 32, 33, 34, 35]], [None, None, [-1, 0, 0, 2, 3]]),
]


@pytest.mark.parametrize("architecture", ["llama", "gemma2", "deepseek_v3"])
def test_static_forward_equals_eager(architecture, device, modes):
    """Every forward of the script gives the eager runner's logits, for each static mode."""
    # A window of 2: the deep tree above has a grandparent inside the window by its index in the
    # forward but outside it by its position.
    target = make_tiny_model(architecture, device=device, window=2)
    _assert_static_equals_eager(target, SCRIPT, modes, max_rows=4, max_width=6)


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_rows_growing_across_key_length_buckets_keep_the_eager_logits(architecture, device, modes, monkeypatch):
    """A forward attends over the shortest key length bucket that holds its longest row (here 4,
    8, 16, 32 ... positions, as 512, 2,048 ... are for real models): two rows of different lengths
    decoding chains and a tree past 16 and 32 positions give the eager runner's logits at every
    step, on full and sliding-window attention."""
    monkeypatch.setattr(static_forward, "MIN_KEY_LENGTH", 4)
    monkeypatch.setattr(static_forward, "KEY_LENGTH_STEP", 2)
    target = make_tiny_model(architecture, device=device, window=2)
    script = [("join", [list(range(3, 13)), list(range(4, 9))])]
    script += [("rows", [[5 + i, 6 + i], [7 + i]]) for i in range(12)]
    script += [("rows", [[11, 12, 13], [14]], [[-1, 0, 0], None])]
    for runner in _assert_static_equals_eager(target, script, modes, max_rows=2, max_width=3):
        assert {length for (_, _, length, _) in runner._static._buckets} >= {16, 32, 64}


def test_shapes_past_the_buckets_run_the_same_forward_unpadded(tiny, device):
    """A batch wider than any bucket still gives the eager logits (the static forward, no bucket)."""
    eager = ModelRunner(tiny.model)
    runner = ModelRunner(tiny.model, execution="static")
    runner.prepare(max_rows=2, max_width=2)
    rows = [list(range(3, 13)), list(range(4, 9))]
    want = eager.forward_rows(eager.new_cache(2), rows)
    got = runner.forward_rows(runner.new_batch_cache(2), rows)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)


def test_hidden_states_come_back_for_the_layers_asked(tiny):
    """Hidden-state methods (EAGLE-3, Medusa, MTP) get the same features from the static path, and
    it keeps only the layers asked for."""
    layers = (0, -1)
    eager = ModelRunner(tiny.model, hidden_layers=layers)
    runner = ModelRunner(tiny.model, hidden_layers=layers, execution="static")
    runner.prepare(max_rows=1, max_width=4)
    prompt = list(range(3, 15))
    outputs = [r.forward(prefilled_batch(r, [prompt]), [7, 8, 9]) for r in (eager, runner)]
    count = tiny.model.config.num_hidden_layers + 1
    assert outputs[0].hidden_states.kept == outputs[1].hidden_states.kept == (0, count - 1)
    assert outputs[1].hidden_states.count == count
    for i in layers:
        assert outputs[1].hidden_states[i].shape == (3, tiny.model.config.hidden_size)
        torch.testing.assert_close(outputs[0].hidden_states[i], outputs[1].hidden_states[i], atol=1e-5, rtol=1e-5)


def test_the_static_cache_refuses_what_it_cannot_hold(tiny):
    runner = ModelRunner(tiny.model, execution="static", max_model_len=32)
    runner.prepare(max_rows=2, max_width=4)
    cache = runner.new_batch_cache(2)
    with pytest.raises(ValueError, match="static KV cache of 2 rows"):
        cache.append_rows(runner.new_cache())
    # 32 positions and a forward's 4, in whole tiles of 32 keys (KEY_BLOCK); on the CPU in whole
    # blocks of 512 (KEY_SPLIT), as the eager path reads its keys.
    capacity = KEY_SPLIT if runner.device.type == "cpu" else 2 * KEY_BLOCK
    with pytest.raises(ValueError, match=f"of {capacity} positions"):
        runner.forward_rows(cache, [[3] * (capacity + 6), [3]])
    with pytest.raises(ValueError, match="3 requests"):
        runner.new_batch_cache(3)
    assert isinstance(cache, StaticKVCache) and runner.max_length == 32


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert width_buckets(5) == [1, 2, 3, 4, 5]
    assert width_buckets(60) == [*range(1, 17), 32, 60]
    assert bucket_for(3, [1, 2, 4]) == 4
    assert bucket_for(5, [1, 2, 4]) is None
    # Key lengths: 512, 2,048 ... while at most half the reserved length, then all of it.
    assert static_forward.key_length_buckets(8197) == [512, 2048, 8197]
    assert static_forward.key_length_buckets(1025) == [512, 1025]
    assert static_forward.key_length_buckets(600) == [600]


def test_execution_modes_resolve_per_device():
    """auto captures on CUDA only; CUDA graphs on a CPU are refused with the field's name."""
    assert resolve_execution("auto", torch.device("cpu")) == "eager"
    assert resolve_execution("auto", torch.device("cuda")) == "cuda_graph"
    with pytest.raises(ValueError, match="execution: CUDA graphs need a CUDA device"):
        resolve_execution("cuda_graph", torch.device("cpu"))
    with pytest.raises(ValueError, match="execution: one of"):
        resolve_execution("fast", torch.device("cpu"))


@pytest.mark.parametrize("method", [None, {"decoding_type": "NGram", "max_draft_len": 4}])
def test_greedy_generation_is_identical_on_the_static_path(tiny, device, modes, method):
    """Plain and speculative greedy decoding, batched with rows finishing at different times,
    emit the eager path's tokens on the static path."""
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 11, 8)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 20, 7)]
    want = [o.token_ids for o in LLM(tiny.model, method, tokenizer=tiny.tokenizer, max_batch_size=2).generate(prompts, params)]
    for mode in modes:
        llm = LLM(tiny.model, method, tokenizer=tiny.tokenizer, max_batch_size=2, execution=mode)
        assert [o.token_ids for o in llm.generate(prompts, params)] == want


def test_max_model_len_bounds_requests(tiny):
    """``max_model_len`` caps a request's positions below the model's context, in every mode."""
    for mode in ("eager", "static"):
        llm = LLM(tiny.model, None, tokenizer=tiny.tokenizer, execution=mode, max_model_len=16)
        out = llm.generate({"prompt_token_ids": list(range(3, 13))}, SamplingParams(max_tokens=50, ignore_eos=True))[0]
        assert len(out.token_ids) == 6 and out.finish_reason == "length"
        with pytest.raises(ConfigError, match="context of 16"):
            llm.engine.add_request(list(range(3, 23)), SamplingParams(max_tokens=5))
    with pytest.raises(ConfigError, match="execution: one of"):
        LLM(tiny.model, None, tokenizer=tiny.tokenizer, execution="fast")


def test_a_model_that_cannot_be_captured_runs_eagerly_unless_capture_was_asked_for(tiny, monkeypatch, caplog):
    """Capture chosen by default falls back to the eager runner with a warning when recording
    fails (a forward that syncs with the host); capture asked for explicitly fails to load."""
    from specdec.errors import ModelLoadError
    from specdec.kv_cache import BatchKVCache
    from specdec.static_forward import StaticForward

    def fail(self, hidden_states, show_progress=True):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(StaticForward, "capture_all", fail)
    runner = ModelRunner(tiny.model, execution="static")
    runner._chosen_by_default = True  # as "auto" on CUDA
    runner.prepare(max_rows=2, max_width=3)
    assert runner.execution == "eager" and "running every forward eagerly" in caplog.text
    cache = runner.new_batch_cache(1)
    assert type(cache) is BatchKVCache
    with pytest.raises(ModelLoadError, match="execution: capturing static forwards failed: RuntimeError"):
        ModelRunner(tiny.model, execution="static").prepare(max_rows=2, max_width=3)


def test_the_static_path_accounts_for_its_memory(tiny):
    """The KV cache's bytes are known once a forward allocated it: rows x positions x layers,
    the positions (32, and a forward's 4) in whole tiles of 32 keys, on the CPU in whole blocks of
    512 keys."""
    runner = ModelRunner(tiny.model, execution="static", max_model_len=32)
    assert ModelRunner(tiny.model).static_memory is None
    runner.prepare(max_rows=2, max_width=4)
    cache = runner.new_batch_cache(1)
    runner.forward_rows(cache, [[3, 4]])
    config = tiny.model.config
    per_position = 2 * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4  # K and V, fp32
    positions = KEY_SPLIT if runner.device.type == "cpu" else 2 * KEY_BLOCK
    want = 2 * positions * config.num_hidden_layers * per_position
    assert runner.static_memory == {"kv_cache_bytes": want, "capture_bytes": 0}


def test_buffers_first_filled_in_inference_mode_take_rows_outside_it(device):
    """Capture at start-up runs the first forwards in inference mode, which allocates the static
    buffers there; rows joining later, outside it, still copy into them in place."""
    target = make_tiny_model("llama", device=device)
    runner = ModelRunner(target.model, execution="static")
    runner.prepare(max_rows=2, max_width=2)
    cache = runner.new_batch_cache()
    rows = []
    for prompt in (list(range(3, 12)), list(range(4, 9))):
        rows.append(runner.new_cache())
        runner.forward(rows[-1], prompt, last_only=True)
    with torch.inference_mode():
        cache.append_rows(rows[0])
    cache.append_rows(rows[1])
    assert cache.lengths == [9, 5]


@pytest.mark.parametrize("architecture", ["deepseek_v3", "gpt_oss"])
def test_recorded_forwards_take_experts_of_fixed_shapes(architecture, device):
    """Before recording, float32 mixture-of-experts layers leave grouped_mm (a loop over the
    experts on the host outside bfloat16) for batched_mm, with the same logits; bfloat16 keeps it."""
    target = make_tiny_model(architecture, device=device)
    ids = torch.tensor([list(range(3, 15))], device=device)
    with torch.no_grad():
        before = target.model(ids).logits
        use_recordable_experts(target.model, torch.bfloat16)
        assert target.model.config._experts_implementation == "grouped_mm"
        use_recordable_experts(target.model, torch.float32)
        assert target.model.config._experts_implementation == "batched_mm"
        torch.testing.assert_close(target.model(ids).logits, before, atol=1e-5, rtol=1e-5)


def test_compiled_forward_equals_eager(device):
    """``execution="compile"``: inductor's forward of one bucket (captured as a CUDA graph on
    CUDA) gives the eager runner's logits for a decode after a prefill, within float32 rounding
    of the fused kernels. On CUDA only: the CPU's inductor takes over a minute to compile it, and
    ``compile`` is opt-in there."""
    if device.type != "cuda":
        pytest.skip("compiled and captured forwards are checked on CUDA (SPECDEC_TEST_DEVICE=cuda)")
    target = make_tiny_model("llama", device=device)
    eager, compiled = ModelRunner(target.model), ModelRunner(target.model, execution="compile")
    compiled.prepare(max_rows=1, max_width=1)
    want, got = eager.new_cache(1), compiled.new_batch_cache(0)
    row = compiled.new_cache()
    compiled.forward(row, list(range(3, 12)), last_only=True)
    got.append_rows(row)
    eager.forward_rows(want, [list(range(3, 12))])
    for token in (5, 6, 7):
        expected = eager.forward_rows(want, [[token]])[0].logits
        torch.testing.assert_close(compiled.forward_rows(got, [[token]])[0].logits, expected, atol=1e-4, rtol=1e-4)
