"""``specdec train redrafter``: a recurrent drafter on a frozen target, from its own replies, in Apple's layout."""

from __future__ import annotations

import click
import torch

from specdec import ConfigError
from specdec.training import (
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
from specdec_redrafter.drafter_model import DrafterSpec, RecurrentDrafter, save_drafter
from specdec_redrafter.training.loop import FitOptions, ReDrafterTrainee, describe_shape, drafter_shape


@click.command("redrafter")
@trainer_options(output_help=f"Directory for the drafter (Apple's layout), training.json and {STATE_FILE}.",
                 unit="position", lr=1e-3, lr_help="Peak learning rate (AdamW; Apple's trainer: 1e-3).", decay=1.0,
                 decay_help="Draft position k's loss weight: decay ** k (Apple's trainer: 1, an unweighted sum).")
@click.option("--positions", type=int, default=5, show_default=True,
              help="Draft positions trained: position k learns the token k + 2 ahead (Apple's drafter_predict_n_tokens).")
@click.option("--num-draft-layers", type=click.IntRange(min=0), default=2, show_default=True,
              help="Residual blocks before the output layer (Apple's trainer: 2).")
@click.option("--exit-dim", type=click.IntRange(min=0), default=0, show_default=True,
              help="The MLP's width (0: twice the target's hidden size, as Apple's trainer makes it).")
@click.option("--rnn/--no-rnn", default=True, show_default=True,
              help="A recurrent state over the drafted tokens (else a running sum of their embeddings).")
@click.option("--redrafter-num-beams", type=click.IntRange(min=1), default=None,
              help="Written to config.json (TensorRT-LLM's name): the beams drafting uses unless told otherwise.")
@click.option("--redrafter-draft-len-per-beam", type=click.IntRange(min=1), default=None,
              help="Written to config.json (TensorRT-LLM's name): the draft length per beam drafting uses unless told "
                   "otherwise (at most --positions).")
@click.option("--compact-export", is_flag=True,
              help="With --train-vocab: write a compact checkpoint (the output layer's draft-vocabulary rows and their "
                   "token ids, a sixth of the size for SmolLM2), which specdec loads and Apple's code does not, "
                   "instead of Apple's full layout.")
def redrafter(positions: int, num_draft_layers: int, exit_dim: int, rnn: bool, redrafter_num_beams: int | None,
              redrafter_draft_len_per_beam: int | None, compact_export: bool, **common) -> None:
    """Train a ReDrafter drafter (the target frozen) on conversations the target answered."""
    check_options({"positions": positions}, **common)
    if redrafter_draft_len_per_beam and redrafter_draft_len_per_beam > positions:
        raise ConfigError(f"--redrafter-draft-len-per-beam: {redrafter_draft_len_per_beam} exceeds --positions {positions}")
    if compact_export and not common["train_vocab"]:
        raise ConfigError("--compact-export: needs --train-vocab, the draft vocabulary it keeps")
    output = common["output"]
    with training_inputs(**common) as inputs:
        target = inputs.target
        hidden = int(target.config.hidden_size)
        spec = DrafterSpec(hidden, int(target.config.vocab_size), exit_dim or 2 * hidden, num_draft_layers, rnn,
                           redrafter_num_beams=redrafter_num_beams or 0,
                           redrafter_draft_len_per_beam=redrafter_draft_len_per_beam or 0)
        torch.manual_seed(common["seed"])
        drafter = RecurrentDrafter(spec)
        drafter.reset_parameters()
        if inputs.vocabulary is not None:
            drafter = drafter.narrowed(inputs.vocabulary.ids)
        saved = saved_state(output, common["resume"], drafter_shape(drafter), describe_shape)
        drafter = drafter.to(inputs.world.device)
        exported = drafter.export if inputs.vocabulary is not None and not compact_export else lambda: drafter
        embed = target.get_input_embeddings().to(inputs.world.device).requires_grad_(False)
        options = fit_options(FitOptions, inputs, **common)
        options.positions = positions
        inputs.console.print(f"training a ReDrafter drafter of {num_draft_layers} blocks x {spec.exit_dim}"
                             f"{', recurrent' if rnn else ''} for {positions} positions: {inputs.summary(options)}")
        export_dtype = common["export_dtype"]
        run_training(ReDrafterTrainee(drafter, embed, FrozenTarget(target), options, inputs.vocabulary), inputs, options,
                     output, saved, lambda: save_drafter(exported(), output, DTYPES[export_dtype]), "position",
                     _heldout_fields, _held_line, {}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote the drafter ({export_dtype}) to {output}")


def _held_line(step: int, evaluation: ChainEvaluation) -> str:
    return (f"step {step}: held-out loss per position {per_output(evaluation.losses)}, "
            f"top-1 {per_output(evaluation.accuracies)}, estimated chain acceptance length {evaluation.acceptance_length:.2f}")


def _heldout_fields(evaluation: ChainEvaluation) -> dict[str, object]:
    return {"heldout_loss_per_position": evaluation.losses, "heldout_accuracy_per_position": evaluation.accuracies,
            "heldout_chain_acceptance_length": evaluation.acceptance_length}
