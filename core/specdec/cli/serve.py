"""``specdec serve``: the OpenAI, Triton and Prometheus HTTP endpoints over one loaded model."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from specdec.cli.common import build_config, method_options, model_options, quiet_transformers
from specdec.config_loader import split_llm_api_options
from specdec.errors import ConfigError, SpecdecError
from specdec.llm import LLM
from specdec.reasoning import PARSERS, ReasoningParser
from specdec.server.engine_thread import EngineThread

#: The served name of the embedded default model.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: Modules of the ``serve`` extra.
_SERVE_MODULES = {"fastapi", "starlette", "uvicorn", "prometheus_client"}
#: Options of a TensorRT-LLM LLM API file that ``serve`` honours; the others are reported as ignored.
_HONOURED_OPTIONS = ("max_batch_size", "cuda_graph_config", "max_seq_len", "kv_cache_config")


@click.command()
@model_options
@method_options(config_aliases=("--extra_llm_api_options",))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0 picks a free port.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=None,
              help="Most requests decoded together [default: the config file's max_batch_size, else 8].")
@click.option("--max-queue-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Most requests waiting for a place in the batch; more are refused with 429.")
@click.option("--served-model-name", default=None,
              help="The model's name in requests and responses [default: the model directory's name].")
@click.option("--max-request-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="Largest request body; larger ones are refused with 413.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds requests in flight may take to finish after SIGTERM before they are aborted.")
@click.option("--warmup/--no-warmup", default=True, show_default=True,
              help="Measure step costs at batch sizes 1, 2, 4, ... and the largest before serving "
                   "(else a forward width at a time in idle moments while serving).")
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@click.option("--reasoning-parser", type=click.Choice(sorted(PARSERS)), default=None,
              help="Give chat replies' <think> reasoning apart from their content (vLLM's parsers).")
@click.option("--api-key", envvar="SPECDEC_API_KEY", default=None, show_envvar=True,
              help="Admit /v1, /tokenize, /detokenize and /v2/models requests only with 'Authorization: Bearer KEY' "
                   "(the OpenAI clients' api_key) or 'x-api-key: KEY' (Anthropic's); /health and /metrics stay open.")
def serve(model, dtype, device, runtime, config_file, method, max_draft_len, speculative_model, settings, host, port,
          max_batch_size, max_queue_size, served_model_name, max_request_bytes, shutdown_timeout, warmup,
          access_log, reasoning_parser, api_key) -> None:
    """Serve the model over HTTP: OpenAI /v1/completions, /v1/chat/completions and /v1/responses,
    Anthropic /v1/messages, vLLM's /tokenize and /detokenize, Triton /v2/models/NAME/generate,
    /health and Prometheus /metrics.

    --extra_llm_api_options takes trtllm-serve's YAML file as it is: its speculative_config,
    max_batch_size, max_seq_len, cuda_graph_config and kv_cache_config.enable_block_reuse are
    used, other keys are reported as ignored.
    """
    try:
        from specdec.server.app import create_app
        from specdec.server.uvicorn_runner import run_app
    except ImportError as exc:
        if exc.name not in _SERVE_MODULES:
            raise
        raise SpecdecError(
            f"specdec serve needs the serve extra ({exc.name} is missing): pip install 'specdec[serve]'"
        ) from None
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if api_key is not None and not api_key.strip():
        raise ConfigError("--api-key: must not be empty (leave it out to serve without a key)")
    config = build_config(config_file, method, max_draft_len, settings, speculative_model)
    if config_file:
        config, options = split_llm_api_options(config)
        file_batch_size, runtime = _file_options(options, runtime, err)
        max_batch_size = max_batch_size or file_batch_size
    with _bind(host, port) as sock:
        quiet_transformers()
        thread = EngineThread()  # the model is loaded, warmed up, run and closed on this thread only
        try:
            with err.status("loading model"):
                llm = thread.run(LLM, model, config, dtype=dtype, device=device, max_batch_size=max_batch_size or 8,
                                 **runtime, max_queue_size=max_queue_size)
            try:
                if warmup:
                    _warm_up(llm, thread, err)
                name = served_model_name or _default_name(model)
                url = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
                caching = "on" if llm.engine.prefill.prefix_cache is not None else "off"
                err.print(f"serving {name} ({llm.method}, batch {llm.engine.max_batch_size}, prefix caching {caching}) at {url}: "
                          f"/v1/completions, /v1/chat/completions, /v2/models/{name}/generate, /metrics"
                          + (" (API key required)" if api_key else ""))
                _log_to(err)
                reasoning = ReasoningParser(reasoning_parser) if reasoning_parser else None
                app = create_app(llm, name, max_request_bytes, thread, api_key, reasoning)
                if not run_app(app, sock, shutdown_timeout, access_log):
                    raise SpecdecError("the server did not start (see the log above)")
            finally:
                thread.run(llm.close)
        finally:
            thread.close()


def _warm_up(llm: LLM, thread: EngineThread, err: Console) -> None:
    """Measure the step costs of the batch sizes the adaptive draft length measures now, rather
    than in idle moments between the first requests, which a measurement then delays."""
    policy = llm.engine.policy
    policy.want(llm.engine.max_batch_size)
    total = len(policy.pending_measurements())
    with err.status("warming up: measuring step costs") as status:
        while pending := policy.pending_measurements():
            status.update(f"warming up: measuring step costs at batch size {pending[0]} "
                          f"({total - len(pending)} of {total} batch sizes done)")
            if not thread.run(llm.engine.idle_work):
                break


def _file_options(options: dict[str, Any], runtime: dict[str, Any], err: Console) -> tuple[int | None, dict[str, Any]]:
    """The LLM API file's ``max_batch_size``, and ``runtime`` with what the file says of it
    (options given on the command line win): ``cuda_graph_config: null`` runs forwards eagerly
    (a mapping keeps them captured on CUDA, its fields aside), ``max_seq_len`` caps the tokens of
    a request, ``kv_cache_config``'s ``enable_block_reuse`` turns prefix caching on or off. Other
    options are reported, once, as ignored."""
    ignored = sorted(key for key in options if key not in _HONOURED_OPTIONS)
    if ignored:
        err.print(f"warning: ignoring LLM API options specdec does not use: {', '.join(ignored)}")
    runtime = dict(runtime)
    if "cuda_graph_config" in options and options["cuda_graph_config"] is None and runtime["execution"] == "auto":
        runtime["execution"] = "eager"
    if options.get("max_seq_len") is not None and runtime["max_model_len"] is None:
        runtime["max_model_len"] = _whole_number(options, "max_seq_len", minimum=2)
    kv_cache = options.get("kv_cache_config") or {}
    if not isinstance(kv_cache, dict):
        raise ConfigError(f"kv_cache_config: must be a mapping, got {kv_cache!r}")
    ignored = sorted(key for key in kv_cache if key != "enable_block_reuse")
    if ignored:
        err.print(f"warning: ignoring kv_cache_config options specdec does not use: {', '.join(ignored)}")
    reuse = kv_cache.get("enable_block_reuse")
    if reuse is not None and "enable_prefix_caching" not in runtime:
        if not isinstance(reuse, bool):
            raise ConfigError(f"kv_cache_config.enable_block_reuse: must be true or false, got {reuse!r}")
        runtime["enable_prefix_caching"] = reuse
    return _whole_number(options, "max_batch_size", minimum=1), runtime


def _whole_number(options: dict[str, Any], key: str, minimum: int) -> int | None:
    value = options.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
        raise ConfigError(f"{key}: must be a whole number of at least {minimum}, got {value!r}")
    return value


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it once the app has started): a port
    in use fails here, before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SpecdecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _default_name(model: str | None) -> str:
    """The model directory's name for a local model, the Hugging Face id for a hub model."""
    if model is None:
        return DEFAULT_MODEL_NAME
    path = Path(model)
    return path.resolve().name if path.exists() else model


def _log_to(console: Console) -> None:
    """Send the server's own log (engine thread failures) to the console, as uvicorn logs."""
    logger = logging.getLogger("specdec.server")
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
