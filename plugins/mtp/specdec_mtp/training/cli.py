"""``specdec train mtp``: DeepSeek-V3 MTP layers for a frozen target that has none, from its own replies."""

from __future__ import annotations

from pathlib import Path

import click
import torch
from rich.console import Console

from specdec.cli.common import quiet_transformers
from specdec.errors import ConfigError
from specdec.models import load_model, resolve_device, resolve_dtype
from specdec.training.distributed import every_rank, join, leave
from specdec.training.examples import ExampleDataset, load_examples
from specdec.training.reporting import TrainingProgress, heldout_note, per_output, split_heldout, write_record
from specdec.training.state import STATE_FILE, Position, read_state
from specdec_mtp.training.loop import Evaluation, FitOptions, FrozenTarget, StepReport, check_shape, fit
from specdec_mtp.training.model import export, export_into_target_copy, new_layers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check(num_layers: int, epochs: int, max_steps: int | None, batch_size: int, lr: float, eval_fraction: float,
           eval_data: tuple[str, ...], max_length: int, chunk_size: int, output: str, into_target_copy: str | None) -> None:
    """One-line errors for options click's types do not already bound."""
    for name, value in (("num-layers", num_layers), ("epochs", epochs), ("batch-size", batch_size),
                        ("max-length", max_length), ("chunk-size", chunk_size)):
        if value < 1:
            raise ConfigError(f"--{name}: must be at least 1, got {value}")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"--max-steps: must be at least 1, got {max_steps}")
    if lr <= 0:
        raise ConfigError(f"--lr: must be positive, got {lr}")
    if not 0 <= eval_fraction < 1:
        raise ConfigError(f"--eval-fraction: must be in [0, 1), got {eval_fraction}")
    if eval_fraction and eval_data:
        raise ConfigError("--eval-fraction and --eval-data are alternatives; give one")
    if into_target_copy is not None and Path(into_target_copy).resolve() == Path(output).resolve():
        raise ConfigError("--into-target-copy: must be another directory than --output")


@click.command("mtp")
@click.option("--data", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl(.xz) the target answered itself (`specdec synthesize`, training-data/); repeatable.")
@click.option("--output", required=True, type=click.Path(file_okay=False),
              help=f"Directory for the layers (DeepSeek-V3 layout, the plugin's speculative_model), training.json "
                   f"and {STATE_FILE}.")
@click.option("--into-target-copy", type=click.Path(file_okay=False), default=None,
              help="Also write a full copy of the target here whose checkpoint holds the layers as "
                   "model.layers.{L}.. with num_nextn_predict_layers in its config.json, as DeepSeek ships them.")
@click.option("--model", default=None, help="Target: HF id or local dir (default: embedded SmolLM2-135M-Instruct).")
@click.option("--dtype", type=click.Choice(["auto", *DTYPES]), default="auto", show_default=True, help="Target dtype.")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
@click.option("--num-layers", type=int, default=1, show_default=True,
              help="MTP layers (num_nextn_predict_layers): layer k drafts the token k + 1 ahead of the target's state.")
@click.option("--epochs", type=int, default=1, show_default=True, help="Passes over the data.")
@click.option("--max-steps", type=int, default=None, help="Optimizer steps in all (instead of --epochs).")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Conversations per step and process.")
@click.option("--max-length", type=int, default=2048, show_default=True, help="Truncate conversations to this many tokens.")
@click.option("--limit", type=int, default=None, help="Train on the first this many conversations only.")
@click.option("--lr", type=float, default=3e-4, show_default=True, help="Peak learning rate (AdamW).")
@click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True,
              help="Linear warm-up steps, then cosine decay to 0.")
@click.option("--loss-decay", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="Depth k's loss weight: decay ** (k - 1); 1 is DeepSeek-V3's equal weighting.")
@click.option("--precision", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
              help="The layers' matrix products: bfloat16 (mixed; weights and losses stay float32) or float32. "
                   "auto: bfloat16 where the device computes it natively (CUDA, CPUs with AMX or AVX512-BF16).")
@click.option("--chunk-size", type=int, default=1024, show_default=True,
              help="Positions per depth whose vocabulary logits are computed at once (memory: chunk x vocab floats).")
@click.option("--group-by-length/--no-group-by-length", default=True, show_default=True,
              help="Batch conversations of similar length together (less padding) rather than at random.")
@click.option("--eval-fraction", type=float, default=0.0, show_default=True,
              help="Share of the conversations held out (seeded) to measure loss and accuracy on.")
@click.option("--eval-data", multiple=True, type=click.Path(dir_okay=False),
              help="Measure on these conversations instead of --eval-fraction; repeatable.")
@click.option("--eval-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also measure the held-out set every this many steps (always: each epoch's end).")
@click.option("--save-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also export and save the training state every this many steps (always: each epoch's end).")
@click.option("--resume", is_flag=True, help=f"Continue from --output's {STATE_FILE} (same layers; the data and seed must match).")
@click.option("--export-dtype", type=click.Choice(list(DTYPES)), default="bfloat16", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def mtp(data, output, into_target_copy, model, dtype, device, num_layers, epochs, max_steps, batch_size, max_length,
        limit, lr, warmup, loss_decay, precision, chunk_size, group_by_length, eval_fraction, eval_data, eval_every,
        save_every, resume, export_dtype, seed) -> None:
    """Train DeepSeek-V3 MTP layers on a frozen target (any Llama-style decoder) from conversations it answered."""
    _check(num_layers, epochs, max_steps, batch_size, lr, eval_fraction, eval_data, max_length, chunk_size, output,
           into_target_copy)
    for path in (*data, *eval_data):
        if not Path(path).is_file():
            raise ConfigError(f"--data: no file {path!r}" if path in data else f"--eval-data: no file {path!r}")
    saved = None
    if resume:
        saved = read_state(output)
        check_shape(saved, num_layers)
    elif (Path(output) / STATE_FILE).exists():
        raise ConfigError(f"--output: {output!r} holds a training state; pass --resume to continue it or choose another directory")
    quiet_transformers()
    console = Console(stderr=True)
    world = join(resolve_device(device))
    try:
        with console.status("loading the target and the data"):
            target, tokenizer = load_model(model, dtype, world.device)
            examples = load_examples(data, tokenizer, max_length, limit)
            heldout = ExampleDataset(load_examples(eval_data, tokenizer, max_length, None, "--eval-data", "measure on")) \
                if eval_data else None
        dataset = ExampleDataset(examples)
        if eval_fraction:
            dataset, heldout = split_heldout(dataset, eval_fraction, seed)
        frozen = FrozenTarget(target)
        layers = new_layers(target, num_layers).to(world.device)
        bf16 = every_rank(resolve_dtype(precision, world.device) == torch.bfloat16, world)
        per_epoch = max(1, len(dataset) // (batch_size * world.size))
        options = FitOptions(steps=max_steps or per_epoch * epochs, batch_size=batch_size, lr=lr, warmup=warmup,
                             decay=loss_decay, chunk=chunk_size, bf16=bf16, group_by_length=group_by_length, seed=seed,
                             save_every=save_every, eval_every=eval_every)
        assistant = sum(int(e.loss_mask.sum()) for e in examples)
        console.print(f"training {num_layers} MTP layer(s) ({type(layers[0].block).__name__} blocks) on a frozen "
                      f"{target.config.model_type} target: {len(examples)} conversations read ({assistant} reply tokens), "
                      f"{len(dataset)} trained on{heldout_note(heldout)}, "
                      f"{options.steps} steps x {batch_size} x {world.size} process(es), "
                      f"{'bfloat16 mixed' if bf16 else 'float32'} precision")
        base = model or "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded default's hub id
        last: dict[str, object] = {}

        def save(at: Position) -> None:
            export(layers, target.config, output, DTYPES[export_dtype], base)
            write_record(output, at, options, data, eval_data, heldout, **last)

        with TrainingProgress(console, options.steps, saved) as progress:

            def on_step(report: StepReport) -> None:
                last.update(step=report.step, train_loss_per_depth=report.losses, train_accuracy_per_depth=report.accuracies)
                progress.step(report.step, report.epoch, report.loss, report.accuracies, report.tokens)
                if report.heldout is not None:
                    last.update(heldout_step=report.step, heldout_loss_per_depth=report.heldout.losses,
                                heldout_accuracy_per_depth=report.heldout.accuracies)
                    progress.print(_held_line(report.step, report.heldout))

            at = fit(layers, frozen, dataset, options, world, output, saved, on_step, save, heldout)
        if at.step == progress.start.step and world.is_main:
            save(at)  # nothing left to train: still leave the layers of the saved state
        if (speed := progress.speed_line(at)) is not None:
            console.print(speed)
        console.print(f"wrote {num_layers} MTP layer(s) ({export_dtype}) to {output}")
        if into_target_copy is not None and world.is_main:
            with console.status("writing the target copy"):
                export_into_target_copy(layers, target, tokenizer, into_target_copy, DTYPES[export_dtype])
            console.print(f"wrote a copy of the target with its MTP layers to {into_target_copy}")
    finally:
        leave(world)


def _held_line(step: int, evaluation: Evaluation) -> str:
    return (f"step {step}: held-out loss per depth {per_output(evaluation.losses)}, "
            f"top-1 {per_output(evaluation.accuracies)}")
