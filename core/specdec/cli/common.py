"""Options shared by ``generate``, ``bench`` and ``serve``: model, dtype and the speculative config."""

from __future__ import annotations

import functools
from typing import Any

import click
import yaml
from pydantic import ValidationError

from specdec.config_loader import format_validation_error, load_config_file
from specdec.errors import ConfigError
from specdec.sampling import SamplingParams


def model_options(command: Any) -> Any:
    """``--model``, ``--dtype``, ``--device``, how forwards run (``--enforce-eager``,
    ``--compile``, ``--max-model-len``), prefix caching and ``--chat-template``, which reach the
    command as one ``runtime`` dict of :class:`~specdec.LLM` keyword arguments (the last three
    only when given on the command line)."""

    def with_runtime(*args: Any, enforce_eager: bool, compile_static: bool, max_model_len: int | None,
                     enable_prefix_caching: bool | None, prefix_cache_gib: float | None, chat_template: str | None,
                     **kwargs: Any) -> Any:
        if enforce_eager and compile_static:
            raise ConfigError("--enforce-eager and --compile exclude each other")
        execution = "eager" if enforce_eager else "compile" if compile_static else "auto"
        runtime: dict[str, Any] = {"execution": execution, "max_model_len": max_model_len}
        if enable_prefix_caching is not None:
            runtime["enable_prefix_caching"] = enable_prefix_caching
        if prefix_cache_gib is not None:
            runtime["prefix_cache_gib"] = prefix_cache_gib
        if chat_template is not None:
            runtime["chat_template"] = chat_template
        return command(*args, runtime=runtime, **kwargs)

    # Not functools.wraps: click passes a callback only the parameters its signature names, and
    # would read the command's own (through ``__wrapped__``), which has ``runtime`` instead.
    with_runtime.__name__, with_runtime.__doc__ = command.__name__, command.__doc__
    with_runtime.__click_params__ = getattr(command, "__click_params__", [])
    func = with_runtime
    func = click.option("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                        help="A Jinja chat template, or its file, in place of the tokenizer's.")(func)
    func = click.option("--prefix-cache-gib", type=click.FloatRange(min=0, min_open=True), default=None,
                        help="Most memory the prefix cache holds, in GiB [default: 1].")(func)
    func = click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=None,
                        help="Reuse the prefill of earlier prompts' leading 256-token blocks [default: on].")(func)
    func = click.option("--max-model-len", type=click.IntRange(min=2), default=None,
                        help="Most tokens (prompt and output) per request (default: the model's context).")(func)
    func = click.option("--compile", "compile_static", is_flag=True,
                        help="Run the static-shape forward through torch.compile (docs/performance.md).")(func)
    func = click.option("--enforce-eager", is_flag=True,
                        help="Run every forward eagerly: no CUDA graphs (captured by default on CUDA).")(func)
    func = click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")(func)
    func = click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                        show_default=True, help="auto: bfloat16 where the hardware computes it natively.")(func)
    func = click.option("--model", default=None, help="HF id or local dir (default: embedded SmolLM2-135M-Instruct).")(func)
    return func


def method_options(func: Any = None, *, config_aliases: tuple[str, ...] = ()) -> Any:
    """The speculative config's options; ``config_aliases`` are more names for ``--config``
    (``@method_options(config_aliases=(...))``)."""
    if func is None:
        return functools.partial(method_options, config_aliases=config_aliases)
    func = click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Set a method option (repeatable).")(func)
    func = click.option("--speculative-model", default=None,
                        help="Draft model or head for the method: HF id or local dir (sets speculative_model).")(func)
    func = click.option("--max-draft-len", type=int, default=None, help="Most draft tokens per step.")(func)
    func = click.option("--method", default=None, help="Method name (see list-methods); 'none' decodes plainly.")(func)
    func = click.option("--config", *config_aliases, "config_file", type=click.Path(dir_okay=False), default=None,
                        help="YAML config (TensorRT-LLM or vLLM style).")(func)
    return func


def sampling_options(func: Any) -> Any:
    func = click.option("--seed", type=int, default=None)(func)
    func = click.option("--min-p", type=float, default=0.0, show_default=True,
                        help="Drop tokens below this fraction of the likeliest token's probability; 0 = off.")(func)
    func = click.option("--top-k", type=int, default=0, show_default=True)(func)
    func = click.option("--top-p", type=float, default=1.0, show_default=True)(func)
    func = click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")(func)
    return func


def build_config(config_file: str | None, method: str | None, max_draft_len: int | None, settings: tuple[str, ...],
                 speculative_model: str | None = None) -> Any:
    """The speculative config the options describe (a dict or ``None``), validated later."""
    extra = max_draft_len is not None or settings or speculative_model is not None
    if config_file and (method or extra):
        raise ConfigError("--config cannot be combined with --method, --max-draft-len, --speculative-model or --set")
    if config_file:
        return load_config_file(config_file)
    if method is None:
        if extra:
            raise ConfigError("--max-draft-len, --speculative-model and --set need --method")
        return None
    config: dict[str, Any] = {"decoding_type": method}
    if max_draft_len is not None:
        config["max_draft_len"] = max_draft_len
    if speculative_model is not None:
        config["speculative_model"] = speculative_model
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            config[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            config[key.strip()] = value
    return config


def sampling_params(**fields: Any) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "sampling")) from None


def quiet_transformers() -> None:
    """Hide transformers' own progress bars and advice; specdec shows its own progress."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
