"""``specdec train eagle3``: ``dump`` target states, ``fit`` a head (offline or online), ``export`` it."""

from __future__ import annotations

import json
from typing import Any

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec import ConfigError, Progress, load_model, resolve_device, resolve_dtype
from specdec.training import (
    STATE_FILE,
    ExampleDataset,
    TrainingRun,
    coverage,
    every_rank,
    join,
    leave,
    load_examples,
    per_output,
    run_training,
    saved_state,
    token_counts,
)
from specdec_eagle3.checkpoint import LAYOUTS, load_head
from specdec_eagle3.compat import default_layers
from specdec_eagle3.training.dump import DumpDataset, check_same_target, write_dump
from specdec_eagle3.training.loop import (
    Eagle3Trainee,
    Evaluation,
    FitOptions,
    describe_shape,
    export,
    head_shape,
    new_head,
    with_draft_vocabulary,
    with_more_layers,
)
from specdec_eagle3.training.sources import OfflineTarget, OnlineTarget
from specdec_eagle3.training.vocab import calibrate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _layers(option: str | None, num_layers: int) -> tuple[int, ...]:
    """``--layers`` (comma list) or EAGLE-3's default {2, L//2, L-3}, checked against the target."""
    if option is None:
        layers = default_layers(num_layers)
    else:
        try:
            layers = tuple(int(x) for x in option.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"--layers: expected comma-separated layer numbers, got {option!r}") from None
    layers = tuple(sorted(layers))
    if not layers or len(set(layers)) != len(layers) or not all(0 <= i < num_layers for i in layers):
        hint = " (the default {2, L//2, L-3} needs at least 7 layers)" if option is None else ""
        raise ConfigError(f"--layers: need distinct layers in 0..{num_layers - 1} for this {num_layers}-layer target{hint}, "
                          f"got {list(layers)}")
    return layers


def _progress(console: Console, label: str, *fields: str) -> Progress:
    extra = [TextColumn(f) for f in fields]
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), *extra, TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console)


def _quiet_transformers() -> None:
    """specdec shows its own progress; transformers' loading bars and advice would interleave."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {value}")


@click.group("eagle3")
def eagle3() -> None:
    """Train EAGLE-3 heads: dump target states, fit a head, export it."""


@eagle3.command("dump")
@click.option("--data", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl (from `specdec synthesize`); repeatable.")
@click.option("--output", required=True, type=click.Path(file_okay=False), help="New directory for the dump.")
@click.option("--model", default=None, help="Target: HF id or local dir (default: embedded SmolLM2-135M-Instruct).")
@click.option("--dtype", type=click.Choice(["auto", *DTYPES]), default="auto", show_default=True,
              help="Target dtype; the states are stored in it.")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
@click.option("--layers", default=None, help="Target layers to fuse, comma list (default: 2, L//2, L-3).")
@click.option("--max-length", type=int, default=2048, show_default=True, help="Truncate conversations to this many tokens.")
@click.option("--limit", type=int, default=None, help="Dump only the first this many conversations.")
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--shard-size", type=int, default=256, show_default=True, help="Conversations per safetensors shard.")
def dump(data, output, model, dtype, device, layers, max_length, limit, batch_size, shard_size) -> None:
    """Run the target once over the conversations and store what training needs (offline mode)."""
    _positive(max_length=max_length, limit=limit, batch_size=batch_size, shard_size=shard_size)
    _quiet_transformers()
    console = Console(stderr=True)
    with console.status("loading the target and the data"):
        target, tokenizer = load_model(model, dtype, device)
        fused = _layers(layers, int(target.config.num_hidden_layers))
        examples = load_examples(data, tokenizer, max_length, limit)
    with _progress(console, "dumping", "{task.fields[tokens]} tokens") as progress:
        task = progress.add_task("dump", total=len(examples), tokens=0)
        seen = {"tokens": 0}

        def on_batch(conversations: int, tokens: int) -> None:
            seen["tokens"] += tokens
            progress.update(task, advance=conversations, tokens=seen["tokens"])

        index = write_dump(target, examples, fused, output, target_name=model or "HuggingFaceTB/SmolLM2-135M-Instruct",
                           batch_size=batch_size, shard_size=shard_size, on_batch=on_batch)
    console.print(f"dumped {index['conversations']} conversations ({index['tokens']} tokens, layers {list(fused)}, "
                  f"{index['dtype']}) to {output}")


@eagle3.command("fit")
@click.option("--offline-data", multiple=True, type=click.Path(),
              help="A dump from `specdec train eagle3 dump` (offline mode); repeatable for dumps of the same target.")
@click.option("--data", multiple=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl; the target runs beside the head (online mode). Repeatable.")
@click.option("--output", required=True, type=click.Path(file_okay=False),
              help=f"Directory for the exported head, training.json and {STATE_FILE}.")
@click.option("--model", default=None, help="Online mode's target: HF id or local dir (default: embedded SmolLM2).")
@click.option("--dtype", type=click.Choice(["auto", *DTYPES]), default="auto", show_default=True, help="Online target dtype.")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
@click.option("--layers", default=None, help="Online mode: target layers to fuse (default: 2, L//2, L-3).")
@click.option("--max-length", type=int, default=2048, show_default=True, help="Online mode: truncate conversations.")
@click.option("--draft-vocab-size", type=int, default=None,
              help="Draft vocabulary size (default: min(32000, target vocabulary)); with --init-head, recalibrate to this size.")
@click.option("--ttt-steps", type=click.IntRange(1, 16), default=7, show_default=True, help="Unrolled training-time-test steps.")
@click.option("--loss-decay", type=float, default=0.8, show_default=True, help="Weight of step k's loss: decay ** k.")
@click.option("--argmax-weight", type=float, default=0.0, show_default=True,
              help="Share of each step's loss that is the cross-entropy with the target's greedy token instead of its "
                   "whole distribution (0: EAGLE-3's loss). Greedy drafting is judged only on that token.")
@click.option("--steps", type=int, default=None, help="Optimizer steps (default: one epoch).")
@click.option("--epochs", type=int, default=None, help="Passes over the data (instead of --steps).")
@click.option("--batch-size", type=int, default=4, show_default=True, help="Conversations per step and process.")
@click.option("--lr", type=float, default=1e-4, show_default=True)
@click.option("--warmup", type=int, default=0, show_default=True, help="Linear warm-up steps.")
@click.option("--init-from-target/--no-init-from-target", default=True, show_default=True,
              help="Start the head's final norm and output layer from the target's.")
@click.option("--init-head", type=click.Path(file_okay=False), default=None,
              help="Continue training this head (either layout) instead of a new one. It keeps its draft vocabulary "
                   "unless --draft-vocab-size is given, which recalibrates the vocabulary on this data.")
@click.option("--num-layers", type=click.IntRange(1, 8), default=None,
              help="Decoder layers of the head (default 1, as EAGLE-3's authors train; more need --layout speculators). "
                   "With --init-head, layers past the head's own are appended as identities and trained from there.")
@click.option("--layout", type=click.Choice(LAYOUTS), default="safeailab", show_default=True, help="Exported checkpoint layout.")
@click.option("--export-dtype", type=click.Choice(list(DTYPES)), default="bfloat16", show_default=True)
@click.option("--save-every", type=int, default=0, show_default=True,
              help="Also export and save the training state every this many steps (always: each epoch's end and the last step).")
@click.option("--resume", is_flag=True,
              help=f"Continue from --output's {STATE_FILE} (the same head shape; the data, seed and options must match).")
@click.option("--heldout", type=int, default=0, show_default=True,
              help="Conversations held out of training (a seeded random choice) to measure the head's agreement on.")
@click.option("--heldout-data", multiple=True, type=click.Path(),
              help="Measure agreement on these instead of --heldout: dumps with --offline-data, conversations jsonl with "
                   "--data. Training conversations with the same conversation_id are not trained on. Repeatable.")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="Also measure held-out agreement every this many steps (always: each epoch's end and the last step).")
@click.option("--precision", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
              help="The head's matrix products: bfloat16 (mixed precision; weights and losses stay float32) or float32. "
                   "auto: bfloat16 where the device computes it natively (CUDA, CPUs with AMX or AVX512-BF16).")
@click.option("--group-by-length/--no-group-by-length", default=True, show_default=True,
              help="Batch conversations of similar length together (less padding to compute) rather than at random.")
@click.option("--seed", type=int, default=0, show_default=True)
def fit_command(offline_data, data, output, model, dtype, device, layers, max_length, draft_vocab_size, ttt_steps, loss_decay,
                argmax_weight, steps, epochs, batch_size, lr, warmup, init_from_target, init_head, num_layers, layout,
                export_dtype, save_every, resume, heldout, heldout_data, eval_every, precision, group_by_length, seed) -> None:
    """Train an EAGLE-3 head with the training-time test and export it in a published layout."""
    if bool(offline_data) == bool(data):
        raise ConfigError("give exactly one of --offline-data (a dump) or --data (conversations, online mode)")
    if steps is not None and epochs is not None:
        raise ConfigError("--steps and --epochs are alternatives; give one")
    _positive(steps=steps, epochs=epochs, batch_size=batch_size, lr=lr, max_length=max_length, draft_vocab_size=draft_vocab_size)
    if not 0 < loss_decay <= 1:
        raise ConfigError(f"--loss-decay: must be in (0, 1], got {loss_decay}")
    if not 0 <= argmax_weight <= 1:
        raise ConfigError(f"--argmax-weight: must be in [0, 1], got {argmax_weight}")
    if warmup < 0 or save_every < 0 or heldout < 0 or eval_every < 0:
        raise ConfigError("--warmup, --save-every, --heldout and --eval-every must be >= 0")
    if heldout and heldout_data:
        raise ConfigError("--heldout and --heldout-data are alternatives; give one")
    if layout == "safeailab" and (num_layers or 1) > 1:
        raise ConfigError(f"--num-layers: the SafeAILab layout holds one decoder layer; for {num_layers} give --layout speculators")
    _quiet_transformers()
    world = join(resolve_device(device))
    console = Console(stderr=True, quiet=not world.is_main)
    try:
        with console.status("loading"):
            held_out: Any = None
            if offline_data:
                if model is not None or layers is not None:
                    raise ConfigError("--model and --layers belong to online mode; a dump records its target and layers")
                dataset: Any = DumpDataset(list(offline_data))
                info = dataset.index
                target_config, fused, verifier = info["target_config"], tuple(info["layers"]), info["target"]
                weights = dataset.target_tensors()
                source: Any = OfflineTarget(weights, world.device)
                if heldout_data:
                    held_out = DumpDataset(list(heldout_data))
                    check_same_target(held_out.index, info, "--heldout-data", "--offline-data")
            else:
                target, tokenizer = load_model(model, dtype, world.device)
                target_config = json.loads(target.config.to_json_string())
                fused = _layers(layers, int(target.config.num_hidden_layers))
                dataset = ExampleDataset(load_examples(data, tokenizer, max_length, None))
                if heldout_data:
                    held_out = ExampleDataset(load_examples(heldout_data, tokenizer, max_length, None, "--heldout-data",
                                                        "measure agreement on"))
                verifier = model or "HuggingFaceTB/SmolLM2-135M-Instruct"
                weights = {"norm.weight": target.model.norm.weight, "lm_head.weight": target.get_output_embeddings().weight}
                source = OnlineTarget(target, fused)
            vocab = int(target_config["vocab_size"])
            if not 0 <= heldout < len(dataset):
                raise ConfigError(f"--heldout: must leave conversations to train on; the data has {len(dataset)}")
            if held_out is None:
                order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
                held = set(order[:heldout])
            else:
                # By id, not position: the same conversation in another file must not be trained on either.
                held_ids = set(held_out.ids)
                held = {i for i, conversation in enumerate(dataset.ids) if conversation in held_ids}
                if len(held) == len(dataset):
                    raise ConfigError("--heldout-data: every training conversation is held out; none is left to train on")
            trained = [i for i in range(len(dataset)) if i not in held]
            # The draft vocabulary comes from the training conversations only.
            assistant, every = token_counts((s for i, s in enumerate(dataset.sequences()) if i not in held), vocab)
            if init_head is not None:
                head = _continued_head(init_head, target_config, fused)
                if num_layers is not None and num_layers != head.config.num_layers:
                    head = with_more_layers(head, num_layers, seed)
                if layout == "safeailab" and head.config.num_layers > 1:
                    raise ConfigError(f"--layout: {init_head} has {head.config.num_layers} decoder layers; "
                                      "the SafeAILab layout holds one, so give --layout speculators")
                if draft_vocab_size is not None:
                    d2t, t2d = calibrate(assistant, every, draft_vocab_size)
                    shared = int((head.t2d & t2d).sum())
                    head = with_draft_vocabulary(head, d2t, t2d, weights["lm_head.weight"])
                    console.print(f"recalibrated the draft vocabulary on this data: {shared} of its {draft_vocab_size} tokens "
                                  f"keep the head's output rows, the rest start from the target's, mapped into the head's space")
                head = head.to(world.device)
                d2t, t2d = head.d2t, head.t2d
            else:
                d2t, t2d = calibrate(assistant, every, draft_vocab_size or min(32000, vocab))
                head = new_head(target_config, fused, d2t, t2d, weights if init_from_target else None, seed,
                                num_layers or 1).to(world.device)
        heldout_set = held_out
        if heldout_set is None and held:
            heldout_set = torch.utils.data.Subset(dataset, sorted(held))
        dataset = torch.utils.data.Subset(dataset, trained) if held else dataset
        per_epoch = max(1, len(dataset) // (batch_size * world.size))
        bf16 = resolve_dtype(precision, world.device) == torch.bfloat16
        if precision == "auto":
            bf16 = every_rank(bf16, world)  # one precision for all ranks, even on mixed devices
        options = FitOptions(steps=steps or per_epoch * (epochs or 1), batch_size=batch_size, lr=lr, warmup=warmup,
                             ttt_steps=ttt_steps, decay=loss_decay, argmax_weight=argmax_weight, seed=seed,
                             save_every=save_every, eval_every=eval_every,
                             group_by_length=group_by_length, bf16=bf16)
        saved = saved_state(output, resume, head_shape(head.config), describe_shape)
        held_note = ""
        if held_out is not None:
            held_note = f" ({len(held_out)} held-out conversations from --heldout-data, {len(held)} of them in the training data)"
        elif held:
            held_note = f" ({len(held)} held out)"
        console.print(f"{'offline' if offline_data else 'online'} training: {len(dataset)} conversations"
                      f"{held_note}, layers {list(fused)}, "
                      f"draft vocabulary {int(d2t.numel())} tokens covering {coverage(assistant, t2d):.1%} of reply tokens, "
                      f"{options.ttt_steps} TTT steps (decay {loss_decay}), {options.steps} steps x {batch_size} x {world.size} "
                      f"process(es), {'bfloat16 mixed' if bf16 else 'float32'} precision")
        architectures = tuple(target_config.get("architectures") or ())

        record = {"init_head": init_head, "layers": list(fused), "num_layers": head.config.num_layers,
                  "draft_vocab_size": int(d2t.numel())}
        run_training(Eagle3Trainee(head, source, options), TrainingRun(world, console, dataset, heldout_set), options, output,
                     saved, lambda: export(head, output, layout, DTYPES[export_dtype], verifier, architectures, min(ttt_steps, 8)),
                     "step", _heldout_fields, _held_line, record, offline_data or data, heldout_data)
        console.print(f"wrote {layout} head to {output}")
    finally:
        leave(world)


def _held_line(step: int, evaluation: Evaluation) -> str:
    return (f"step {step}: held-out: agreement per TTT step {per_output(evaluation.agreement)}, predicted acceptance length "
            f"of a chain of {len(evaluation.agreement)}: {evaluation.acceptance_length:.2f}")


def _heldout_fields(evaluation: Evaluation) -> dict[str, object]:
    return {"heldout_accuracy_per_step": evaluation.agreement, "heldout_acceptance_length": evaluation.acceptance_length}


def _continued_head(path: str, target_config: dict[str, Any], fused: tuple[int, ...]) -> Any:
    """A trained head to continue, in float32, refused unless it reads the data's target and layers."""
    head = load_head(path)
    config = head.config
    recorded = config.layers_to_capture
    if config.target_hidden_size != int(target_config["hidden_size"]) or config.vocab_size != int(target_config["vocab_size"]):
        raise ConfigError(
            f"--init-head: {path} was trained for a target with hidden size {config.target_hidden_size} and "
            f"vocabulary {config.vocab_size}, not {target_config['hidden_size']} and {target_config['vocab_size']}"
        )
    if recorded is not None and tuple(recorded) != tuple(fused):
        raise ConfigError(f"--init-head: {path} fuses target layers {list(recorded)}, the data has layers {list(fused)}")
    return head.float().train()


@eagle3.command("export")
@click.option("--head", "head_dir", required=True, type=click.Path(), help="An EAGLE-3 head in either layout.")
@click.option("--output", required=True, type=click.Path(file_okay=False))
@click.option("--layout", type=click.Choice(LAYOUTS), required=True)
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="bfloat16", show_default=True)
@click.option("--verifier", default=None, help="The target's HF id or path (speculators' verifier field).")
@click.option("--speculative-tokens", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Draft length recorded in the speculators config.")
def export_command(head_dir, output, layout, dtype, verifier, speculative_tokens) -> None:
    """Rewrite a head in another published layout (SafeAILab or vLLM speculators)."""
    head = load_head(head_dir)
    export(head, output, layout, DTYPES[dtype], verifier, (), speculative_tokens)
    Console(stderr=True).print(f"wrote {layout} head to {output}")
