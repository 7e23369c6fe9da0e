"""``specdec train mlp-speculator``: an MLP speculator on a frozen target, from its own replies, in IBM's layout."""

from __future__ import annotations

import click
import torch

from specdec import ConfigError, ModelLoadError
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
from specdec_mlp_speculator.speculator import CompactSpeculator, MLPSpeculator, SpeculatorSpec, load_speculator, save_speculator
from specdec_mlp_speculator.training.loop import (
    FitOptions,
    MLPSpeculatorTrainee,
    describe_shape,
    speculator_shape,
)


_SHAPE_OPTIONS = ("n_predict", "inner_dim", "tie_weights", "scale_input", "top_k_tokens_per_head")


@click.command("mlp-speculator")
@trainer_options(output_help=f"Directory for the speculator (IBM's layout), training.json and {STATE_FILE}.",
                 unit="stage", lr=1e-3, lr_help="Peak learning rate (AdamW).", decay=1.0,
                 decay_help="Stage k's loss weight: decay ** k.")
@click.option("--n-predict", type=int, default=3, show_default=True, help="Stages: stage k drafts the token k + 2 ahead.")
@click.option("--inner-dim", type=click.IntRange(min=0), default=0, show_default=True,
              help="The stages' width (0: the target's hidden size).")
@click.option("--tie-weights/--no-tie-weights", default=False, show_default=True,
              help="Stages share their embedding, norm and output layer (and stages 1 on their projection).")
@click.option("--scale-input/--no-scale-input", default=True, show_default=True,
              help="Stage 0 reads the target's state RMS-normalised and divided by sqrt(2).")
@click.option("--top-k-tokens-per-head", default="4,3,2", show_default=True,
              help="Written to config.json: the draft tree's branching per stage (one count per stage, comma-separated).")
@click.option("--init-from", type=click.Path(exists=True, file_okay=False), default=None,
              help="Start from the speculator in this directory (IBM's layout: a first stage's --output, or a "
                   "published accelerator) instead of from IBM's initialisation; it sets the shape, which the shape "
                   "options must then leave at their defaults. IBM's second stage: this with --data of the "
                   "target's own generations (`specdec synthesize`).")
@click.option("--compact-export", is_flag=True,
              help="With --train-vocab: write a compact checkpoint (only the draft vocabulary's rows and their token "
                   "ids, a sixth of the size for SmolLM2), which specdec loads and vLLM does not, instead of IBM's "
                   "full layout.")
def mlp_speculator(n_predict: int, inner_dim: int, tie_weights: bool, scale_input: bool, top_k_tokens_per_head: str,
                   init_from: str | None, compact_export: bool, **common) -> None:
    """Train an MLP speculator on a frozen target from conversations (IBM's first stage), or go on
    from one on the target's own generations (``--init-from``: the second)."""
    if init_from is not None:
        _check_shape_options_left_out()
    check_options({"n-predict": n_predict}, **common)
    if compact_export and not common["train_vocab"]:
        raise ConfigError("--compact-export: needs --train-vocab, the draft vocabulary it keeps")
    top_k = _top_k(top_k_tokens_per_head, n_predict)
    output = common["output"]
    with training_inputs(**common) as inputs:
        target = inputs.target
        hidden = int(target.config.hidden_size)
        torch.manual_seed(common["seed"])
        if init_from is None:
            start = MLPSpeculator(SpeculatorSpec(hidden, inner_dim or hidden, n_predict, int(target.config.vocab_size),
                                                 tie_weights, scale_input, top_k))
            start.reset_parameters()
        else:
            start = _initial(init_from, hidden, int(target.config.vocab_size))
        spec, vocabulary = start.spec, inputs.vocabulary
        speculator = start if vocabulary is None else CompactSpeculator.narrowed(start, vocabulary.ids)
        saved = saved_state(output, common["resume"], speculator_shape(speculator.spec), describe_shape)
        speculator = speculator.float().to(inputs.world.device)
        exported = (lambda: speculator) if vocabulary is None or compact_export else speculator.export
        options = fit_options(FitOptions, inputs, **common)
        inputs.console.print(f"training an MLP speculator of {spec.n_predict} stages x {spec.inner_dim}"
                             f"{', tied' if spec.tie_weights else ''}{f' from {init_from}' if init_from else ''}: "
                             f"{inputs.summary(options)}")
        export_dtype = common["export_dtype"]
        run_training(MLPSpeculatorTrainee(speculator, FrozenTarget(target), options, vocabulary), inputs, options,
                     output, saved, lambda: save_speculator(exported(), output, DTYPES[export_dtype]), "stage",
                     _heldout_fields, _held_line, {}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote the speculator ({export_dtype}) to {output}")


def _check_shape_options_left_out() -> None:
    context = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in _SHAPE_OPTIONS
             if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise ConfigError(f"--init-from: the speculator it names sets the shape; leave out {', '.join(given)}")


def _initial(directory: str, hidden_size: int, vocab_size: int) -> MLPSpeculator:
    """The speculator ``--init-from`` names, as a one-line error when it does not load."""
    try:
        return load_speculator(directory, hidden_size, vocab_size)
    except (ConfigError, ModelLoadError) as error:
        raise ConfigError(f"--init-from: {error}") from None


def _top_k(text: str, n_predict: int) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--top-k-tokens-per-head: expected comma-separated counts, got {text!r}") from None
    if len(counts) != n_predict or min(counts) < 1:
        raise ConfigError(f"--top-k-tokens-per-head: needs {n_predict} counts of at least 1 (one per stage), got {text!r}")
    return counts


def _held_line(step: int, evaluation: ChainEvaluation) -> str:
    return (f"step {step}: held-out loss per stage {per_output(evaluation.losses)}, top-1 {per_output(evaluation.accuracies)}, "
            f"estimated chain acceptance length {evaluation.acceptance_length:.2f}")


def _heldout_fields(evaluation: ChainEvaluation) -> dict[str, object]:
    return {"heldout_loss_per_stage": evaluation.losses, "heldout_accuracy_per_stage": evaluation.accuracies,
            "heldout_chain_acceptance_length": evaluation.acceptance_length}
