"""``specdec train medusa``: Medusa-1 heads on a frozen target, from its own replies, in FasterDecoding's layout."""

from __future__ import annotations

import click

from specdec.training import (
    DEFAULT_BASE,
    DTYPES,
    STATE_FILE,
    ChainEvaluation,
    FrozenTarget,
    check_options,
    fit_options,
    per_output,
    run_training,
    saved_state,
    trainer_options,
    training_inputs,
)
from specdec_medusa.training.loop import FitOptions, MedusaTrainee, describe_shape, heads_shape
from specdec_medusa.training.model import export, new_heads


@click.command("medusa")
@trainer_options(output_help=f"Directory for the heads (FasterDecoding layout), training.json and {STATE_FILE}.",
                 unit="head", lr=1e-3, lr_help="Peak learning rate (AdamW), as Medusa's.", decay=0.8,
                 decay_help="Head k's loss weight: decay ** k (Medusa's 0.8).")
@click.option("--num-heads", type=int, default=4, show_default=True, help="Heads: head k drafts the token k + 2 ahead of the state.")
@click.option("--num-layers", type=int, default=1, show_default=True, help="Residual blocks per head.")
@click.option("--share-lm-head/--own-lm-head", default=True, show_default=True,
              help="Heads project through the target's frozen lm_head (residual blocks only: 0.3M parameters a head "
                   "for SmolLM2) or each through its own copy, trained (Medusa's original: +28M parameters a head).")
def medusa(num_heads: int, num_layers: int, share_lm_head: bool, **common) -> None:
    """Train Medusa heads (Medusa-1: the target frozen) on conversations the target answered."""
    check_options({"num-heads": num_heads, "num-layers": num_layers}, **common)
    output = common["output"]
    saved = saved_state(output, common["resume"], heads_shape(num_heads, num_layers, share_lm_head), describe_shape)
    with training_inputs(**common) as inputs:
        target = inputs.target
        heads = new_heads(num_heads, num_layers, target.get_output_embeddings().weight, share_lm_head).to(inputs.world.device)
        options = fit_options(FitOptions, inputs, **common)
        inputs.console.print(f"training {num_heads} Medusa heads x {num_layers} block(s), "
                             f"{'sharing the target lm_head' if share_lm_head else 'each with its own lm_head'}: "
                             f"{inputs.summary(options)}")
        export_dtype, base = common["export_dtype"], common["model"] or DEFAULT_BASE
        run_training(MedusaTrainee(heads, FrozenTarget(target), options, inputs.vocabulary), inputs, options, output, saved,
                     lambda: export(heads, output, DTYPES[export_dtype], base), "head", _heldout_fields, _held_line,
                     {"share_lm_head": share_lm_head}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote {num_heads} heads ({'shared' if share_lm_head else 'own'} lm_head, {export_dtype}) "
                             f"to {output}")


def _held_line(step: int, evaluation: ChainEvaluation) -> str:
    return (f"step {step}: held-out loss per head {per_output(evaluation.losses)}, top-1 {per_output(evaluation.accuracies)}, "
            f"estimated chain acceptance length {evaluation.acceptance_length:.2f}")


def _heldout_fields(evaluation: ChainEvaluation) -> dict[str, object]:
    return {"heldout_loss_per_head": evaluation.losses, "heldout_accuracy_per_head": evaluation.accuracies,
            "heldout_chain_acceptance_length": evaluation.acceptance_length}
