"""``specdec train mtp``: DeepSeek-V3 MTP layers for a frozen target that has none, from its own replies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from specdec import ConfigError
from specdec.training import (
    DEFAULT_BASE,
    DTYPES,
    STATE_FILE,
    check_options,
    fit_options,
    per_output,
    run_training,
    saved_state,
    trainer_options,
    training_inputs,
)
from specdec_mtp.training.loop import Evaluation, FitOptions, MTPTarget, MTPTrainee, describe_shape, layers_shape
from specdec_mtp.training.model import export, export_into_target_copy, new_layers, start_from


@click.command("mtp")
@trainer_options(output_help=f"Directory for the layers (DeepSeek-V3 layout, the plugin's speculative_model), "
                             f"training.json and {STATE_FILE}.",
                 unit="depth", lr=3e-4, lr_help="Peak learning rate (AdamW).", decay=1.0,
                 decay_help="Depth k's loss weight: decay ** (k - 1); 1 is DeepSeek-V3's equal weighting.")
@click.option("--into-target-copy", type=click.Path(file_okay=False), default=None,
              help="Also write a full copy of the target here whose checkpoint holds the layers as "
                   "model.layers.{L}.. with num_nextn_predict_layers in its config.json, as DeepSeek ships them.")
@click.option("--num-layers", type=int, default=1, show_default=True,
              help="MTP layers (num_nextn_predict_layers): layer k drafts the token k + 1 ahead of the target's state.")
@click.option("--num-depths", type=int, default=None,
              help="Depths trained (default: one per layer). Past --num-layers the last layer is trained again on "
                   "its own outputs, as the plugin reuses it when max_draft_len exceeds the layers.")
@click.option("--init-from", type=click.Path(exists=True, file_okay=False), default=None,
              help="Start the layers from the MTP layers in this directory (DeepSeek-V3 layout: an earlier run's "
                   "--output, or a DeepSeek checkpoint) instead of from the target's last layer.")
@click.option("--omit-shared-head", is_flag=True,
              help="Leave shared_head.head (the target's frozen lm_head, 28M parameters for SmolLM2) out of the "
                   "exported layers: the plugin then projects through the target's own lm_head. Small to ship, but "
                   "vLLM and TensorRT-LLM require the tensor.")
def mtp(into_target_copy: str | None, num_layers: int, num_depths: int | None, init_from: str | None,
        omit_shared_head: bool, **common) -> None:
    """Train DeepSeek-V3 MTP layers on a frozen target (any Llama-style decoder) from conversations it answered."""
    output = common["output"]
    if into_target_copy is not None and Path(into_target_copy).resolve() == Path(output).resolve():
        raise ConfigError("--into-target-copy: must be another directory than --output")
    if num_depths is not None and num_depths < num_layers:
        raise ConfigError(f"--num-depths: must be at least --num-layers ({num_layers}), got {num_depths}")
    check_options({"num-layers": num_layers}, **common)
    saved = saved_state(output, common["resume"], layers_shape(num_layers, num_depths), describe_shape)
    with training_inputs(**common) as inputs:
        target, world = inputs.target, inputs.world
        layers = new_layers(target, num_layers)
        if init_from is not None:
            start_from(layers, init_from, target.config)
        layers = layers.to(world.device)
        options = replace(fit_options(FitOptions, inputs, **common), depths=num_depths)
        inputs.console.print(f"training {describe_shape(layers_shape(num_layers, num_depths))} "
                             f"({type(layers[0].block).__name__} blocks) on a frozen "
                             f"{target.config.model_type} target: {inputs.summary(options)}")
        export_dtype, base = DTYPES[common["export_dtype"]], common["model"] or DEFAULT_BASE
        run_training(MTPTrainee(layers, MTPTarget(target), options, inputs.vocabulary), inputs, options, output, saved,
                     lambda: export(layers, target.config, output, export_dtype, base, not omit_shared_head), "depth", _heldout_fields,
                     _held_line, {}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote {num_layers} MTP layer(s) ({common['export_dtype']}) to {output}")
        if into_target_copy is not None and world.is_main:
            with inputs.console.status("writing the target copy"):
                export_into_target_copy(layers, target, inputs.tokenizer, into_target_copy, export_dtype)
            inputs.console.print(f"wrote a copy of the target with its MTP layers to {into_target_copy}")


def _held_line(step: int, evaluation: Evaluation) -> str:
    return (f"step {step}: held-out loss per depth {per_output(evaluation.losses)}, "
            f"top-1 {per_output(evaluation.accuracies)}")


def _heldout_fields(evaluation: Evaluation) -> dict[str, object]:
    return {"heldout_loss_per_depth": evaluation.losses, "heldout_accuracy_per_depth": evaluation.accuracies}
