"""`specdec serve`: real servers in subprocesses on 127.0.0.1, driven by real clients (the official
`openai` client, httpx with raw bodies as curl sends them, prometheus_client's parser).

Three servers of the tiny float32 model start together, once for the module: n-gram speculation
for most tests, the example `echo` plugin told to fail for one token (failure isolation), and a
one-row, one-slot server (a full queue, then SIGTERM).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec import LLM, RequestMetrics, SamplingParams, StructuredOutputsParams
from specdec.errors import ConfigError
from specdec.cli.main import main
from specdec.requests import RequestDelta
from specdec.server.metrics import RequestTracker, ServerMetrics
from specdec.testing.tiny import JSON_CHARS, make_tiny_target

#: A function to call (OpenAI's tools format).
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                          "required": ["city"], "additionalProperties": False}}}
#: The main server's --served-model-name (the Triton tutorial's model name).
MODEL = "tensorrt_llm"
URL_LINE = re.compile(r"serving \S+ .* at (http://127\.0\.0\.1:\d+)")
#: Prompts for concurrent greedy requests: the tiny tokenizer knows lowercase letters and " .,:!?\n".
WORDS = ["the quick", "hello world", "brown fox", "lazy dog", "jumps over", "a small cat", "red apple", "blue sky"]
ENDS = ["and more", "again and again", "says hi", "or not"]
PROMPTS = [f"{a} {b}" for a in WORDS for b in ENDS]
#: One compute thread per server: the tiny model gains nothing from more, and servers and the test
#: process share the machine's cores (with several threads each, a 64-wide matmul spins for ms).
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: A request that runs until it is aborted (about a second: sampled text gives n-gram drafts
#: little to accept, and the tiny model's context is 1024 tokens).
LONG = {"prompt": "count: a b c", "max_tokens": 1000, "ignore_eos": True, "temperature": 1, "seed": 0}


class Server:
    """`specdec serve` in a subprocess on a port it picks itself (``--port 0``), its log in a file."""

    def __init__(self, log: Path, args: list[str], env: dict[str, str] | None = None, api_key: str | None = None) -> None:
        self.log = log
        self.api_key = api_key
        if api_key is not None:
            env = {**(env or {}), "SPECDEC_API_KEY": api_key}
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specdec.cli.main", "serve", "--dtype", "float32", "--port", "0", *args],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV, **(env or {})},
            )
        self.url = ""

    def wait_ready(self, timeout: float = 180.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}:\n{self.log.read_text()}"
            match = self.url or URL_LINE.search(self.log.read_text())
            if match:
                self.url = self.url or match.group(1)
                try:
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"the server was not ready within {timeout} s:\n{self.log.read_text()}")

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(**{"base_url": f"{self.url}/v1", "api_key": self.api_key or "x", "max_retries": 0,
                                "timeout": 60, **kwargs})

    def post(self, path: str, body: object, timeout: float | httpx.Timeout = 60) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return httpx.post(f"{self.url}{path}", json=body, timeout=timeout, headers=headers)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics by (name, sorted labels)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _total(metrics: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture(scope="module")
def offline(tiny_dir: Path) -> Iterator[LLM]:
    """The same model, decoded plainly in this process: the reference for greedy outputs."""
    with LLM(str(tiny_dir), dtype="float32") as llm:
        yield llm


def _greedy(llm: LLM, prompt: str, max_tokens: int, **fields: object) -> str:
    return llm.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, **fields))[0].text


#: ModelOpt's deployment file for trtllm-serve, as it is but for the model path and one batch row.
TRTLLM_OPTIONS = """\
enable_attention_dp: false
disable_overlap_scheduler: true
enable_autotuner: false
max_batch_size: 1

cuda_graph_config:
    max_batch_size: 1

speculative_config:
    decoding_type: NGram
    max_draft_len: 3

kv_cache_config:
    enable_block_reuse: false
"""

#: The small server's --chat-template (a file).
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"

#: The json server's --api-key (given as SPECDEC_API_KEY).
API_KEY = "sk-specdec-test"

#: Prompts decoded beside the failing request; the echo server fails for a token none of them holds.
BESIDE = ["hello world", "the quick brown fox", "a lazy dog"]


@pytest.fixture(scope="module")
def fail_token(offline: LLM) -> tuple[int, str]:
    """A character token in no prompt or greedy output of :data:`BESIDE`, and the character."""
    used = set("".join(BESIDE + [_greedy(offline, p, 12) for p in BESIDE]))
    char = next(c for c in "!?:.,zyxwvq" if c not in used)
    return offline.encode(char)[-1], char


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path, tiny_json_dir: Path, plugins_env: dict[str, str],
            fail_token: tuple[int, str]) -> Iterator[dict[str, Server]]:
    """The three servers, started together (their start-up overlaps)."""
    logs = tmp_path_factory.mktemp("server-logs")
    model = ["--model", str(tiny_dir)]
    plain_costs = ["--set", "adaptive_draft_len=false"]  # no cost measurements to wait for
    trtllm_options = logs / "extra-llm-api-config.yml"
    trtllm_options.write_text(TRTLLM_OPTIONS)
    template = logs / "template.jinja"
    template.write_text(PLAIN_TEMPLATE)
    started = {
        "main": Server(logs / "main.log", [*model, "--method", "ngram", "--max-draft-len", "3", *plain_costs,
                                             "--served-model-name", "tensorrt_llm", "--max-request-bytes", "65536"]),
        "echo": Server(logs / "echo.log", [*model, "--method", "echo", *plain_costs,
                                             "--set", f"fail_on_token={fail_token[0]}"],
                       env=plugins_env),
        "small": Server(logs / "small.log", [*model, "--extra_llm_api_options", str(trtllm_options),
                                               "--max-queue-size", "1", "--shutdown-timeout", "1",
                                               "--chat-template", str(template)]),
        "json": Server(logs / "json.log", ["--model", str(tiny_json_dir), "--method", "ngram", *plain_costs, "--served-model-name", MODEL,
                                           "--reasoning-parser", "qwen3"],
                       api_key=API_KEY),
    }
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def server(servers: dict[str, Server]) -> Server:
    return servers["main"].wait_ready()


@pytest.fixture(scope="module")
def tiny_json_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-json")
    target = make_tiny_target(chars=JSON_CHARS)
    target.model.save_pretrained(path)
    target.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def json_server(servers: dict[str, Server]) -> Server:
    """A tiny model whose characters can spell JSON and tool calls, served with an API key."""
    return servers["json"].wait_ready()


@pytest.fixture(scope="module")
def echo_server(servers: dict[str, Server]) -> Server:
    return servers["echo"].wait_ready()


@pytest.fixture(scope="module")
def small_server(servers: dict[str, Server]) -> Server:
    return servers["small"].wait_ready()


def test_serve_without_the_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Without the serve extra, `serve` fails in one line naming the extra (exit status 2)."""
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ModuleNotFoundError
    for name in [m for m in sys.modules if m.startswith("specdec.server")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["serve", "--model", "/nonexistent"]) == 2
    assert "pip install 'specdec[serve]'" in capsys.readouterr().err


def test_health_and_models(server: Server, echo_server: Server, tiny_dir: Path) -> None:
    """/health and Triton's readiness answer 200; /v1/models lists the served model: by
    --served-model-name, else by the model directory's name."""
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert [(m.id, m.object) for m in server.client().models.list().data] == [("tensorrt_llm", "model")]
    assert [m.id for m in echo_server.client().models.list().data] == [tiny_dir.name]


def test_trtllm_options_file_is_taken_as_it_is(small_server: Server) -> None:
    """--extra_llm_api_options with ModelOpt's file: its speculative_config, max_batch_size and
    kv_cache_config's enable_block_reuse (prefix caching) are used, the other keys reported once,
    in one warning line."""
    log = small_server.log.read_text()
    assert "(ngram, batch 1, prefix caching off)" in log
    warnings = [line for line in log.splitlines() if "ignoring" in line]
    assert len(warnings) == 1
    for key in ("disable_overlap_scheduler", "enable_attention_dp", "enable_autotuner"):
        assert key in warnings[0]
    assert "cuda_graph_config" not in warnings[0] and "kv_cache_config" not in warnings[0]


def test_trtllm_file_options_set_how_forwards_run() -> None:
    """``cuda_graph_config: null`` turns captured forwards off, ``max_seq_len`` caps a request,
    ``kv_cache_config.enable_block_reuse`` turns prefix caching on or off (its other keys are
    reported as ignored); the command line wins over the file, and a bad value names its key."""
    from rich.console import Console

    from specdec.cli.serve import _file_options

    quiet = Console(file=io.StringIO())
    auto = {"execution": "auto", "max_model_len": None}
    assert _file_options({"cuda_graph_config": None, "max_seq_len": 512}, auto, quiet) == (
        None, {"execution": "eager", "max_model_len": 512})
    assert _file_options({"cuda_graph_config": {"max_batch_size": 1}, "max_batch_size": 4}, auto, quiet) == (4, auto)
    given = {"execution": "compile", "max_model_len": 64}
    assert _file_options({"cuda_graph_config": None, "max_seq_len": 512}, given, quiet) == (None, given)
    with pytest.raises(ConfigError, match="max_seq_len: must be a whole number of at least 2"):
        _file_options({"max_seq_len": "long"}, auto, quiet)
    reuse = {"kv_cache_config": {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.8}}
    said = Console(file=io.StringIO(), width=200)
    assert _file_options(reuse, auto, said) == (None, {**auto, "enable_prefix_caching": False})
    assert "ignoring kv_cache_config options specdec does not use: free_gpu_memory_fraction" in said.file.getvalue()
    on = {**auto, "enable_prefix_caching": True}
    assert _file_options(reuse, on, quiet) == (None, on)
    with pytest.raises(ConfigError, match="kv_cache_config.enable_block_reuse: must be true or false"):
        _file_options({"kv_cache_config": {"enable_block_reuse": "yes"}}, auto, quiet)


def test_completion_matches_offline_greedy(server: Server, offline: LLM) -> None:
    """A greedy completion is the offline greedy output; usage counts the tokens."""
    client = server.client()
    out = client.completions.create(model=MODEL, prompt="hello world, hello", max_tokens=20, temperature=0)
    assert out.object == "text_completion" and out.model == MODEL and out.id.startswith("cmpl-")
    choice = out.choices[0]
    assert choice.text == _greedy(offline, "hello world, hello", 20)
    assert choice.finish_reason in ("stop", "length") and choice.logprobs is None
    assert out.usage.prompt_tokens == len(offline.encode("hello world, hello"))
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_streaming_equals_non_streaming(server: Server, offline: LLM) -> None:
    """Streamed chat chunks (role first, usage last) add up to the non-streamed reply and the
    offline chat reply; perf metrics come with the last content chunk when asked for."""
    client = server.client()
    messages = [{"role": "user", "content": "say hello"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
    expected = offline.chat(messages, SamplingParams(temperature=0, max_tokens=16))[0].text
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected
    chunks = list(client.chat.completions.create(
        model=reply.model, messages=messages, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_perf_metrics": True},
    ))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == reply.choices[0].finish_reason
    assert set(last.perf_metrics) == {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                                      "mean_acceptance_length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_logprobs_are_the_offline_ones_whole_and_streamed(server: Server, offline: LLM) -> None:
    """Completions' legacy logprobs and chat's content logprobs (from the speculative server) are
    the offline plain decoding's: the chosen tokens' log-probabilities and the likeliest
    alternatives, token strings that add up to the text, offsets that count it; streamed chunks
    carry them piece by piece and add up to the whole response's."""
    client = server.client()
    prompt = "the cat sat on the mat. the cat"
    expected = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=16, logprobs=2))[0]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, logprobs=2)
    logprobs = out.choices[0].logprobs
    assert "".join(logprobs.tokens) == out.choices[0].text == expected.text
    assert logprobs.token_logprobs == pytest.approx([lp.logprob for lp in expected.logprobs], abs=1e-4)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    for token, top, lp in zip(logprobs.tokens, logprobs.top_logprobs, expected.logprobs):
        assert token in top and len(top) == 2  # greedy: the chosen token is the likeliest
        assert sorted(top.values(), reverse=True) == pytest.approx([v for _, v in lp.top], abs=1e-4)

    messages = [{"role": "user", "content": "say hello"}]
    reference = offline.chat(messages, SamplingParams(temperature=0, max_tokens=12, logprobs=3))[0]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([lp.logprob for lp in reference.logprobs], abs=1e-4)
    assert "".join(c.token for c in content) == reply.choices[0].message.content
    assert all(bytes(c.bytes) == c.token.encode() and len(c.top_logprobs) == 3 for c in content)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True))
    streamed = [c for chunk in chunks for choice in chunk.choices if choice.logprobs for c in choice.logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_stream_honours_stop_and_seed(server: Server, offline: LLM) -> None:
    """A stop string ends the streamed text before it, as offline; a seed makes sampling repeatable."""
    client = server.client()
    full = _greedy(offline, "hello world", 24)
    stop = full[8:10]
    expected = _greedy(offline, "hello world", 24, stop=[stop])
    chunks = list(client.completions.create(model=MODEL, prompt="hello world", max_tokens=24, temperature=0,
                                            stop=stop, stream=True))
    assert expected and stop not in expected
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=0.9,
                                         top_p=0.95, seed=7, extra_body={"top_k": 20}).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_n_choices_streamed_and_whole(server: Server, offline: LLM) -> None:
    """n choices are n requests: greedy ones all equal the offline output; seeded sampled ones
    (choice i with seed + i) repeat on a second request; streamed, every choice's chunks add up to
    its text, and usage counts the prompt once and every choice's tokens."""
    client = server.client()
    greedy = client.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert {c.text for c in greedy.choices} == {_greedy(offline, "hello world", 12)}
    assert greedy.usage.completion_tokens == 3 * 12 and greedy.usage.prompt_tokens == len(offline.encode("hello world"))
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10, temperature=1.0, seed=5, n=2)
    whole = [client.chat.completions.create(**chat) for _ in range(2)]
    sampled = [[c.message.content for c in reply.choices] for reply in whole]
    assert sampled[0] == sampled[1]
    chunks = list(client.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)]
    assert texts == sampled[0]
    assert chunks[-1].usage.completion_tokens == whole[0].usage.completion_tokens
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]


def test_triton_generate_as_the_tutorial_sends_it(server: Server, offline: LLM) -> None:
    """The Triton tutorial's curl body (curl -d: a form content type), its reply shape, the prompt
    echoed unless excluded, and the speculation metrics on request; an unknown model is a 404."""
    url = f"{server.url}/v2/models/tensorrt_llm/generate"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = '{"text_input": "What is ML?", "sampling_param_max_tokens": 50, "sampling_param_return_perf_metrics": true}'
    reply = httpx.post(url, content=body, headers=form, timeout=60)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["model_name"] == "tensorrt_llm" and out["model_version"] == "1"
    assert out["text_output"] == "What is ML?" + _greedy(offline, "What is ML?", 50)
    assert out["total_draft_tokens"] >= out["total_accepted_draft_tokens"] >= 0 and 0 <= out["acceptance_rate"] <= 1
    plain = httpx.post(url, content='{"text_input": "What is ML?", "sampling_param_max_tokens": 5, '
                                    '"exclude_input_in_output": true}', timeout=60).json()
    assert plain["text_output"] == _greedy(offline, "What is ML?", 5) and "acceptance_rate" not in plain
    missing = httpx.post(f"{server.url}/v2/models/llama/generate", content=body, timeout=60)
    assert missing.status_code == 404 and "llama" in missing.json()["error"]
    bad = httpx.post(url, content='{"text_input": "x", "sampling_param_top_p": 2}', timeout=60)
    assert bad.status_code == 400 and "top_p" in bad.json()["error"]
    fields = {"min_p": 0.5, "seed": 7, "temperature": 1.0, "repetition_penalty": 1.3, "min_tokens": 3,
              "presence_penalty": 0.5, "frequency_penalty": 0.2}
    body = {"text_input": "What is ML?", "sampling_param_max_tokens": 12, "exclude_input_in_output": True,
            **{f"sampling_param_{k}": v for k, v in fields.items()}}
    reply = httpx.post(url, json=body, timeout=60)
    assert reply.json()["text_output"] == offline.generate("What is ML?", SamplingParams(max_tokens=12, **fields))[0].text


def test_triton_generate_stream_sends_each_increment(server: Server, offline: LLM) -> None:
    """generate_stream answers server-sent events, one per text increment (no prompt echo), that
    add up to the greedy output, the speculation metrics on the last; errors are Triton's."""
    url = f"{server.url}/v2/models/tensorrt_llm/generate_stream"
    body = '{"text_input": "What is ML?", "sampling_param_max_tokens": 30, "sampling_param_return_perf_metrics": true}'
    with httpx.stream("POST", url, content=body, timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in reply.iter_lines() if line.startswith("data: ")]
    assert len(events) > 1 and all(e["model_name"] == "tensorrt_llm" for e in events)
    assert "".join(e["text_output"] for e in events) == _greedy(offline, "What is ML?", 30)
    assert "acceptance_rate" in events[-1] and "acceptance_rate" not in events[0]
    bad = httpx.post(url, content='{"text_input": "x", "sampling_param_top_p": 2}', timeout=60)
    assert bad.status_code == 400 and "top_p" in bad.json()["error"]


def test_lossy_accepted_counter_moves_by_each_deltas_increase() -> None:
    """``specdec:spec_decode_num_lossy_accepted_tokens`` adds what each delta's cumulative count
    adds, as the vLLM counters beside it do."""
    metrics = ServerMetrics("m")
    tracker = RequestTracker(arrival=0.0)
    for lossy in (1, 3):
        step = RequestMetrics(num_drafts=1, num_draft_tokens=4, num_accepted_tokens=4, num_lossy_accepted_tokens=lossy)
        metrics.observe(tracker, RequestDelta(0, [5], "a", False, None, None, 3, step), now=1.0)
    samples = {s.name: s.value for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert samples["specdec:spec_decode_num_lossy_accepted_tokens_total"] == 3


def test_metrics_count_what_the_requests_report(server: Server) -> None:
    """The spec-decode counters move by the perf metrics the requests report; request, token and
    latency series move by one request each."""
    client = server.client()
    before = server.metrics()
    outs = [client.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0,
                                      extra_body={"return_perf_metrics": True, "ignore_eos": True})
            for p in ("abc abc abc ab", "hello hello hello")]
    after = server.metrics()

    def moved(name: str, **labels: str) -> float:
        return _total(after, name, **labels) - _total(before, name, **labels)

    perf = [o.model_extra["perf_metrics"] for o in outs]
    assert moved("vllm:spec_decode_num_draft_tokens_total") == sum(p["total_draft_tokens"] for p in perf) > 0
    accepted = sum(p["total_accepted_draft_tokens"] for p in perf)
    assert moved("vllm:spec_decode_num_accepted_tokens_total") == accepted > 0
    assert moved("vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert moved("vllm:spec_decode_num_drafts_total") > 0
    # n-gram speculation is lossless: the lossy counter is exported and stays at 0.
    assert any(n == "specdec:spec_decode_num_lossy_accepted_tokens_total" for n, _ in after)
    assert moved("specdec:spec_decode_num_lossy_accepted_tokens_total") == 0
    assert moved("vllm:request_success_total", finished_reason="length") == 2
    assert moved("vllm:generation_tokens_total") == sum(o.usage.completion_tokens for o in outs) == 48
    assert moved("vllm:prompt_tokens_total") == sum(o.usage.prompt_tokens for o in outs)
    for histogram in ("time_to_first_token", "e2e_request_latency"):
        assert moved(f"vllm:{histogram}_seconds_count") == 2
    assert moved("vllm:inter_token_latency_seconds_count") > 0
    assert _total(after, "vllm:num_requests_running") == _total(after, "vllm:num_requests_waiting") == 0


def test_a_repeated_long_prompt_is_served_from_the_prefix_cache(server: Server) -> None:
    """The second time a 600-token prompt comes, its first two 256-token blocks come from the
    prefix cache: OpenAI's ``usage.prompt_tokens_details.cached_tokens`` says so (whole and
    streamed), vLLM's prefix-cache counters move by it, and the reply is the same."""
    client = server.client()
    prompt = "a lazy dog jumps over the red apple " * 17  # 612 characters, one token each
    request = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    before = server.metrics()
    first = client.completions.create(**request)
    second = client.completions.create(**request)
    after = server.metrics()
    assert first.usage.prompt_tokens == second.usage.prompt_tokens >= len(prompt)
    assert (first.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens_details.cached_tokens) == (0, 512)
    assert second.choices[0].text == first.choices[0].text
    assert _total(after, "vllm:prefix_cache_hits_total") - _total(before, "vllm:prefix_cache_hits_total") == 512
    queried = _total(after, "vllm:prefix_cache_queries_total") - _total(before, "vllm:prefix_cache_queries_total")
    assert queried == 2 * first.usage.prompt_tokens
    chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 512
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text


def test_tokenize_and_detokenize_as_vllm(server: Server, offline: LLM) -> None:
    """vLLM's /tokenize gives the ids a completion or a chat completion prefills (counted, with
    the context length, and the token strings when asked), /detokenize their text; bad input is a
    400 naming the field, another model a 404."""
    url, text = server.url, "hello world"
    whole = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True}).json()
    assert whole["tokens"] == offline.encode(text) and whole["count"] == len(whole["tokens"])
    assert whole["max_model_len"] == offline.runner.max_length
    assert whole["token_strs"] == offline.tokenizer.convert_ids_to_tokens(whole["tokens"])
    bare = httpx.post(f"{url}/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == offline.tokenizer(text, add_special_tokens=False)["input_ids"] and bare["token_strs"] is None
    messages = [{"role": "user", "content": text}]
    chat = httpx.post(f"{url}/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert chat["tokens"] == offline.encode(messages, chat=True)
    reply = server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert reply.usage.prompt_tokens == chat["count"]  # what the chat completion prefilled
    back = httpx.post(f"{url}/detokenize", json={"model": MODEL, "tokens": whole["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": offline.tokenizer.decode(whole["tokens"])}
    for path, body, status, param in [
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"model": "other", "prompt": text}, 404, "model"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ]:
        answer = httpx.post(f"{url}{path}", json=body)
        assert answer.status_code == status and answer.json()["error"]["param"] == param, (path, body, answer.text)
    assert httpx.get(f"{url}/health").status_code == 200


def test_concurrent_clients_each_get_their_offline_output(server: Server, offline: LLM) -> None:
    """32 clients at once (4x the batch): every reply completes and equals its prompt decoded
    offline and alone."""

    async def run_all() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)

        async def one(prompt: str) -> str:
            out = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
            return out.choices[0].text

        async with client:
            return await asyncio.wait_for(asyncio.gather(*(one(p) for p in PROMPTS)), timeout=60)

    texts = asyncio.run(run_all())
    assert texts == [_greedy(offline, p, 12) for p in PROMPTS]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", b'{"prompt": "hi", ', 400, None),
        ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
        ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"99": 1}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"a": 1}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "a(b"}, 400, "structured_outputs.regex"),
        ("/v1/completions", {"prompt": "hi", "structured_outputs": {"grammar": "start: nothing"}}, 400,
         "structured_outputs.grammar"),
        ("/v1/completions", {"prompt": "hi", "guided_choice": []}, 400, "guided_choice"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "a", "response_format": {"type": "json_object"}}, 400,
         "response_format"),
        ("/v1/completions", {"prompt": "hi", "response_format": {"type": "json_schema"}}, 400, "response_format"),
        ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "echo"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400,
         "tool_choice"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {}}]}, 400,
         "tools"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                  "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                  "tool_choice": "required", "guided_regex": "a"}, 400, "tool_choice"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
         "top_logprobs"),
        ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
        ("/v1/completions", {"prompt": "a" * 2000}, 400, "prompt"),
        ("/v1/completions", {"prompt": "a" * 70000}, 413, None),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 17}, 400, "n"),
        ("/v1/completions", {"prompt": "hi", "min_p": 1.5}, 400, "min_p"),
        ("/v1/completions", {"prompt": "hi", "use_beam_search": True}, 400, "use_beam_search"),
        ("/v1/completions", {"prompt": "hi", "skip_special_tokens": False}, 400, "skip_special_tokens"),
        ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 1}, 400, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "chat_template_kwargs": {"tokenize": False}}, 400, "chat_template_kwargs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False,
                                  "continue_final_message": True}, 400, "continue_final_message"),
    ],
)
def test_client_errors_are_4xx_with_openai_error_json(server: Server, path: str, body: object, status: int,
                                                     param: str | None) -> None:
    """Each bad request gets its 4xx and OpenAI's error object; the server goes on serving."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"}, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["code"] == status
    assert error["message"]
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_structured_output_and_penalties_through_the_openai_client(server: Server, offline: LLM) -> None:
    """OpenAI's ``response_format``, vLLM's ``structured_outputs`` and ``guided_*`` fields and the
    penalties reach the engine: the speculative server's greedy output is plain offline decoding's
    with the same constraint and processors, and matches the constraint."""
    client = server.client()
    messages = [{"role": "user", "content": "is the sky blue?"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "boolean"}}},
    )
    assert reply.choices[0].message.content in ("true", "false")
    expected = offline.chat([messages], SamplingParams(max_tokens=12, structured_outputs=StructuredOutputsParams(json={"type": "boolean"})))
    assert reply.choices[0].message.content == expected[0].text
    cases = [
        ({"guided_choice": ["the quick brown fox", "a lazy dog"]}, {"structured_outputs": StructuredOutputsParams(
            choice=["the quick brown fox", "a lazy dog"])}),
        ({"structured_outputs": {"regex": "([a-z]+ ){3}[a-z]+\\."}}, {"structured_outputs": StructuredOutputsParams(
            regex="([a-z]+ ){3}[a-z]+\\.")}),
        ({"repetition_penalty": 1.3, "min_tokens": 5, "bad_words": ["the"]},
         {"repetition_penalty": 1.3, "min_tokens": 5, "bad_words": ["the"]}),
    ]
    for extra_body, fields in cases:
        got = client.completions.create(model=MODEL, prompt="hello world", temperature=0, max_tokens=16,
                                        frequency_penalty=0.5, presence_penalty=0.2, extra_body=extra_body)
        want = _greedy(offline, "hello world", 16, frequency_penalty=0.5, presence_penalty=0.2, **fields)
        assert got.choices[0].text == want, extra_body
    assert got.choices[0].text and "the" not in got.choices[0].text.split()


def test_vllm_request_fields_reach_the_engine(server: Server, offline: LLM) -> None:
    """vLLM's ``min_p``, ``include_stop_str_in_output``, ``chat_template_kwargs`` and
    ``continue_final_message`` are honoured, not dropped: each reply is offline decoding's with
    the same settings (min_p changes this seeded reply, so dropping it would show)."""
    client = server.client()
    seeded = {"temperature": 1.0, "seed": 7, "max_tokens": 16}
    got = client.completions.create(model=MODEL, prompt="hello world", extra_body={"min_p": 0.5}, **seeded)
    want = offline.generate("hello world", SamplingParams(min_p=0.5, **seeded))[0].text
    assert got.choices[0].text == want != offline.generate("hello world", SamplingParams(**seeded))[0].text

    full = _greedy(offline, "hello world", 16)
    stop = full[3:6]
    got = client.completions.create(model=MODEL, prompt="hello world", temperature=0, max_tokens=16, stop=[stop],
                                    extra_body={"include_stop_str_in_output": True})
    assert got.choices[0].text == full[: full.index(stop) + len(stop)]

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello th"}]
    got = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8, extra_body={
        "add_generation_prompt": False, "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False}})
    want = offline.chat(messages, SamplingParams(max_tokens=8), add_generation_prompt=False, continue_final_message=True,
                        chat_template_kwargs={"enable_thinking": False})
    assert got.choices[0].message.content == want[0].text


def test_tool_calls_named_required_and_auto_whole_and_streamed(json_server: Server, tiny_json_dir: Path) -> None:
    """A named function's call is its arguments, constrained to its schema; ``required`` gives a
    list of calls; ``auto`` answers in text when the model calls nothing. The speculative server
    gives plain offline decoding's calls, whole and streamed (named calls stream their arguments)."""
    client = json_server.client()
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    with LLM(str(tiny_json_dir), dtype="float32") as offline:
        for choice in (named, "required", "auto"):
            reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice=choice,
                                                   temperature=0, max_tokens=60)
            expected = offline.chat(messages, SamplingParams(max_tokens=60), tools=[WEATHER], tool_choice=choice)[0]
            got = reply.choices[0]
            if choice == "auto":
                assert got.message.tool_calls is None and got.message.content == expected.text
                continue
            assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == [
                (c.name, c.arguments) for c in expected.tool_calls]
            arguments = json.loads(got.message.tool_calls[0].function.arguments)
            assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
            assert got.finish_reason == ("stop" if choice is named else "tool_calls") == expected.finish_reason
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice=named,
                                                     temperature=0, max_tokens=60, stream=True))
    deltas = [d for chunk in chunks if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and len(deltas) > 1
    whole = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice=named,
                                           temperature=0, max_tokens=60)
    assert "".join(d.function.arguments for d in deltas) == whole.choices[0].message.tool_calls[0].function.arguments
    required = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required",
                                                   temperature=0, max_tokens=60, stream=True))
    calls = [d for chunk in required if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function.name == "get_weather" and required[-1].choices[0].finish_reason == "tool_calls"
    json_reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=200,
                                                response_format={"type": "json_object"})
    content = json_reply.choices[0].message.content
    assert content.lstrip().startswith("{")
    if json_reply.choices[0].finish_reason == "stop":  # else cut short: a valid prefix
        assert isinstance(json.loads(content), dict)


def test_reasoning_comes_apart_from_the_content_whole_and_streamed(json_server: Server) -> None:
    """``--reasoning-parser qwen3``: a reply that opens with ``<think>`` gives its thoughts as
    ``reasoning`` (and vLLM's former ``reasoning_content``), the rest as ``content``, whole and
    streamed alike; a reply without them is all content."""
    client = json_server.client(api_key=API_KEY)
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "think"}], max_tokens=40, temperature=0,
                extra_body={"guided_regex": "<think>[a-z]{3,8}</think>[a-z]{2,6}"})
    whole = client.chat.completions.create(**chat).choices[0].message
    thought, answer = whole.model_extra["reasoning"], whole.content
    assert 3 <= len(thought) <= 8 and 2 <= len(answer) <= 6 and thought.isalpha() and answer.isalpha()
    assert whole.model_extra["reasoning_content"] == thought
    chunks = list(client.chat.completions.create(**chat, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == answer
    plain = client.chat.completions.create(**{**chat, "extra_body": {"guided_regex": "[a-z]{4}"}}).choices[0].message
    assert len(plain.content) == 4 and "reasoning" not in (plain.model_extra or {})


def _chat_text(client: openai.OpenAI, messages: list[dict], **fields: object) -> str:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **fields).choices[0].message.content


def test_responses_api_answers_as_chat_completions_do(json_server: Server) -> None:
    """``/v1/responses`` through the official client: instructions and input make the chat the
    reply is decoded from (the same text as the chat completion), ``max_output_tokens`` ends it
    ``incomplete``, usage counts as OpenAI's does, and the stream's typed events add up to the
    whole response."""
    client = json_server.client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    whole = client.responses.create(model=MODEL, instructions="be brief", input="hello", max_output_tokens=12, temperature=0)
    assert whole.object == "response" and whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in whole.output] == ["message"]
    assert whole.output_text == _chat_text(client, messages, max_tokens=12)
    chat_usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage
    assert whole.usage.input_tokens == chat_usage.prompt_tokens and whole.usage.output_tokens == 12
    as_items = client.responses.create(model=MODEL, max_output_tokens=12, temperature=0, input=[
        {"role": "developer", "content": "be brief"}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}])
    assert as_items.output_text == whole.output_text
    events = list(client.responses.create(model=MODEL, instructions="be brief", input="hello", max_output_tokens=12,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text and events[-1].response.usage.output_tokens == 12


def test_stored_responses_continue_and_can_be_read_and_deleted(json_server: Server) -> None:
    """A response is stored unless ``store`` is false: ``previous_response_id`` continues its
    conversation (without its instructions, as OpenAI's API does), ``GET`` reads it back and
    ``DELETE`` forgets it; an id not kept is a 404 naming the field."""
    client = json_server.client()
    first = client.responses.create(model=MODEL, instructions="be brief", input="hello", max_output_tokens=6, temperature=0)
    assert first.store is True
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="again", max_output_tokens=6,
                                     temperature=0)
    assert second.previous_response_id == first.id
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "again"}]
    assert second.usage.input_tokens == json_server.post("/tokenize", {"messages": messages}).json()["count"]
    assert second.output_text == _chat_text(client, messages, max_tokens=6)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    unstored = client.responses.create(model=MODEL, input="hello", max_output_tokens=2, store=False)
    answer = json_server.post("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": unstored.id})
    assert answer.status_code == 404 and answer.json()["error"]["param"] == "previous_response_id"


def test_responses_api_runs_an_agent_loop_with_function_tools(json_server: Server) -> None:
    """A function tool in the Responses shape gives a ``function_call`` item (constrained to its
    schema when named); sending it back with its output continues the conversation, as does
    sending the output alone after ``previous_response_id``; reasoning (the server's qwen3 parser)
    is an item of its own; what the server cannot do is a 400 naming it."""
    client = json_server.client()
    weather = {"type": "function", "name": "get_weather", **{k: v for k, v in WEATHER["function"].items() if k != "name"}}
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.responses.create(model=MODEL, input=ask, tools=[weather], temperature=0, max_output_tokens=60,
                                    tool_choice={"type": "function", "name": "get_weather"})
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    chat = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], temperature=0, max_tokens=60,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert call.arguments == chat.choices[0].message.tool_calls[0].function.arguments
    streamed = list(client.responses.create(model=MODEL, input=ask, tools=[weather], temperature=0, max_output_tokens=60,
                                            tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(call.name, call.arguments)]
    follow = [*ask, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = client.responses.create(model=MODEL, input=follow, tools=[weather], temperature=0, max_output_tokens=8)
    assert second.usage.input_tokens > first.usage.input_tokens and second.output
    thought = client.responses.create(model=MODEL, input="think", temperature=0, max_output_tokens=40,
                                      extra_body={"guided_regex": "<think>[a-z]{3,8}</think>[a-z]{2,6}"})
    assert [item.type for item in thought.output] == ["reasoning", "message"]
    assert 3 <= len(thought.output[0].content[0].text) <= 8 and 2 <= len(thought.output_text) <= 6
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[weather], temperature=0,
                                      max_output_tokens=8, input=[follow[-1]])
    assert chained.usage.input_tokens == second.usage.input_tokens and chained.output_text == second.output_text
    for body, param in [({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
                        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
                        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens")]:
        answer = json_server.post("/v1/responses", {"model": MODEL, **body})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (body, answer.text)


def test_anthropic_messages_api_as_the_official_client_sends_it(json_server: Server) -> None:
    """``/v1/messages`` through Anthropic's client (its key sent as ``x-api-key``): ``system`` and
    the messages make the chat the reply is decoded from; usage splits the prompt into tokens read
    from the prefix cache and the rest; the stream adds up to the whole message (the client's own
    accumulator reads it); a tool use is constrained to its schema, stops the turn, and its result
    continues it; reasoning is a thinking block; bad input is a 400 in Anthropic's error shape."""
    client = anthropic.Anthropic(base_url=json_server.url, api_key=API_KEY, max_retries=0, timeout=60)
    openai_client = json_server.client()
    greedy = {"temperature": 0}  # Anthropic's client no longer takes sampling parameters as arguments
    ask = dict(model=MODEL, max_tokens=12, extra_body=greedy, system="be brief", messages=[{"role": "user", "content": "hello"}])
    whole = client.messages.create(**ask)
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert whole.type == "message" and whole.stop_reason == "max_tokens" and [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == _chat_text(openai_client, chat, max_tokens=12)
    prompt_tokens = openai_client.chat.completions.create(model=MODEL, messages=chat, max_tokens=1).usage.prompt_tokens
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == prompt_tokens and whole.usage.output_tokens == 12
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == whole.content[0].text and streamed.stop_reason == "max_tokens"
    weather = {"name": "get_weather", "description": "the weather in a city", "input_schema": WEATHER["function"]["parameters"]}
    question = [{"role": "user", "content": "What is the weather in Oslo?"}]
    tool = dict(model=MODEL, max_tokens=60, extra_body=greedy, messages=question, tools=[weather],
                tool_choice={"type": "tool", "name": "get_weather"})
    used = client.messages.create(**tool)
    call = used.content[-1]
    assert used.stop_reason == "tool_use" and call.type == "tool_use" and call.name == "get_weather" and set(call.input) == {"city"}
    with client.messages.stream(**tool) as stream:
        assert stream.get_final_message().content[-1].input == call.input
    result = client.messages.create(model=MODEL, max_tokens=8, extra_body=greedy, tools=[weather], messages=[
        *question, {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}])
    assert result.usage.input_tokens + result.usage.cache_read_input_tokens > prompt_tokens and result.content
    thought = client.messages.create(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "think"}],
                                     extra_body={**greedy, "guided_regex": "<think>[a-z]{3,8}</think>[a-z]{2,6}"})
    assert [b.type for b in thought.content] == ["thinking", "text"] and 3 <= len(thought.content[0].thinking) <= 8
    for body, field in [({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
                        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0].type"),
                        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "all"}}, "tool_choice.type")]:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model=MODEL, max_tokens=4, **body)
        assert info.value.body["error"]["type"] == "invalid_request_error" and field in info.value.body["error"]["message"]
    missing = json_server.post("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=json_server.url, api_key="wrong", max_retries=0).messages.create(**ask)


def test_an_api_key_guards_the_api_routes_only(json_server: Server) -> None:
    """With --api-key, the OpenAI, tokenizer and Triton model routes answer 401 (in their API's error shape)
    to a request without the key or with another; the key admits it; /health and /metrics stay
    open."""
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as info:
        json_server.client(api_key="sk-wrong").chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert info.value.status_code == 401 and info.value.body["param"] is None
    for headers in ({}, {"Authorization": API_KEY}, {"Authorization": f"Basic {API_KEY}"}):
        reply = httpx.post(f"{json_server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=headers)
        assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer", headers
        assert reply.json()["error"]["code"] == 401
    reply = httpx.post(f"{json_server.url}/v2/models/{MODEL}/generate", json={"text_input": "hi"})
    assert reply.status_code == 401 and "API key" in reply.json()["error"]
    assert httpx.get(f"{json_server.url}/health").status_code == 200
    assert httpx.get(f"{json_server.url}/metrics").status_code == 200
    assert httpx.get(f"{json_server.url}/v1/models").status_code == 401
    assert httpx.post(f"{json_server.url}/tokenize", json={"prompt": "hi"}).status_code == 401
    assert json_server.post("/tokenize", {"prompt": "hi"}).status_code == 200
    assert json_server.client().models.list().data[0].id == MODEL
    assert json_server.post(f"/v2/models/{MODEL}/generate", {"text_input": "hi"}).status_code == 200


def test_body_limit_holds_without_content_length(server: Server) -> None:
    """A chunked body (no Content-Length) is cut off with 413 once it passes the limit."""

    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"a" * 4096
        yield b'"}'

    reply = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=60)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == 413


def test_client_errors_through_the_openai_client(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, temperature=-1, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])


def test_disconnected_clients_free_their_rows(server: Server) -> None:
    """A client that leaves mid-stream, or mid non-streaming request, has its request aborted:
    the running gauge returns to 0 and the requests count as aborted, not as finished."""
    before = server.metrics()
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/completions", LONG, timeout=httpx.Timeout(60, read=0.1))
    deadline = time.monotonic() + 20
    while True:
        now = server.metrics()
        aborted = _total(now, "vllm:request_success_total", finished_reason="abort") - \
            _total(before, "vllm:request_success_total", finished_reason="abort")
        if aborted == 2 and _total(now, "vllm:num_requests_running") == 0:
            break
        assert time.monotonic() < deadline, f"aborted {aborted}, running {_total(now, 'vllm:num_requests_running')}"
        time.sleep(0.1)
    assert _total(now, "vllm:request_success_total", finished_reason="length") == \
        _total(before, "vllm:request_success_total", finished_reason="length")


def test_a_failing_drafter_fails_only_its_request(echo_server: Server, offline: LLM, fail_token: tuple[int, str]) -> None:
    """The echo drafter raises for requests holding the fail token: that request gets a 500
    (streamed: an error event), the requests decoded beside it finish with their offline output,
    and the server keeps serving."""
    client = echo_server.client()
    model = client.models.list().data[0].id
    bad_prompt = f"oh no{fail_token[1]} boom"
    results: dict[str, object] = {}

    def good(prompt: str) -> None:
        out = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
        results[prompt] = out.choices[0].text

    def bad() -> None:
        results["bad"] = echo_server.post("/v1/completions", {"prompt": bad_prompt, "max_tokens": 12, "temperature": 0})

    def bad_stream() -> None:
        try:
            list(client.completions.create(model=model, prompt=bad_prompt, max_tokens=12, stream=True))
        except openai.APIError as exc:
            results["bad_stream"] = exc

    threads = [threading.Thread(target=good, args=(p,)) for p in BESIDE]
    threads += [threading.Thread(target=bad), threading.Thread(target=bad_stream)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results["bad"].status_code == 500
    error = results["bad"].json()["error"]
    assert error["type"] == "server_error" and "echo" in error["message"] and "RuntimeError" in error["message"]
    assert "RuntimeError" in str(results["bad_stream"])
    for prompt in BESIDE:
        assert results[prompt] == _greedy(offline, prompt, 12)
    good(BESIDE[0])  # and after it
    assert results[BESIDE[0]] == _greedy(offline, BESIDE[0], 12)
    metrics = echo_server.metrics()
    assert _total(metrics, "vllm:request_success_total", finished_reason="error") == 2


def test_a_failing_request_ends_the_responses_and_messages_apis_in_their_shape(echo_server: Server,
                                                                               fail_token: tuple[int, str]) -> None:
    """A request whose drafter fails (after ``test_a_failing_drafter_fails_only_its_request``,
    which counts the failures before it): the Responses and Messages APIs answer a 500 in their
    own error shape, and their streams end with their own ``error`` event."""
    model = echo_server.client().models.list().data[0].id
    content = f"oh no{fail_token[1]} boom"
    cases = [("/v1/responses", {"input": content, "max_output_tokens": 12}),
             ("/v1/messages", {"messages": [{"role": "user", "content": content}], "max_tokens": 12})]
    for path, body in cases:
        whole = echo_server.post(path, {"model": model, "temperature": 0, **body})
        error = whole.json()["error"]
        assert whole.status_code == 500 and "RuntimeError" in error["message"], whole.text
        assert error["type"] == ("api_error" if path == "/v1/messages" else "server_error")
        with httpx.stream("POST", f"{echo_server.url}{path}", json={"model": model, "temperature": 0, "stream": True, **body},
                          timeout=60) as reply:
            events = [json.loads(line[len("data: "):]) for line in reply.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "error" and "RuntimeError" in str(events[-1]), (path, events[-1])
        assert events[0]["type"] == ("message_start" if path == "/v1/messages" else "response.created")


def test_a_chat_template_file_renders_the_chats(small_server: Server, offline: LLM) -> None:
    """``--chat-template FILE`` replaces the tokenizer's template for chat completions and
    ``/tokenize``."""
    messages = [{"role": "user", "content": "hi"}]
    tokens = small_server.post("/tokenize", {"messages": messages}).json()["tokens"]
    assert offline.tokenizer.decode(tokens) == "user: hi\nassistant:"
    client = small_server.client()
    reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=2)
    assert reply.usage.prompt_tokens == len(tokens)


def test_a_full_queue_is_refused_at_once(small_server: Server) -> None:
    """With one batch row and one queue slot taken, the next request is refused with 429 and
    Retry-After, quickly; the two in flight are unaffected."""
    url = f"{small_server.url}/v1/completions"
    with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=60) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # kept: were it collected, httpx would close the connection
        next(line for line in lines if line.startswith("data:"))
        with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=60) as waiting:
            assert waiting.status_code == 200
            start = time.monotonic()
            refused = small_server.post("/v1/completions", LONG)
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert time.monotonic() - start < 5
            assert _total(small_server.metrics(), "vllm:num_requests_waiting") == 1


def test_sigterm_ends_requests_and_exits_zero(small_server: Server) -> None:
    """SIGTERM with a stream in flight: after the grace period (1 s here) the stream ends with an
    error event and [DONE], and the server exits with status 0. (Runs last: it stops the module's
    small server.)"""
    with httpx.stream("POST", f"{small_server.url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as reply:
        lines = reply.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        small_server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    assert "shutting down" in rest[-2] or '"finish_reason":"length"' in rest[-2]
    assert small_server.proc.wait(timeout=30) == 0, small_server.log.read_text()
