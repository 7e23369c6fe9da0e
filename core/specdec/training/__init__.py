"""The training API a drafter plugin's trainer may use: the core loop behind ``specdec train <method>``
(options, resume, held-out curve, target-state cache, torch.distributed), and the data pieces
around it. Together with the top-level ``specdec`` module this is the whole core API a plugin
imports (docs/writing-a-plugin.md); CI checks that with import-linter."""

from specdec.training.batching import LengthGroupedBatches, collate, conversation_lengths, pad
from specdec.training.chain_walk import ChainEvaluation, chain_acceptance, evaluate_chain, shifted
from specdec.training.chained_positions import chained_loss
from specdec.training.command import (
                                      DEFAULT_BASE,
                                      DTYPES,
                                      TrainingInputs,
                                      TrainingRun,
                                      check_options,
                                      fit_options,
                                      run_training,
                                      saved_state,
                                      trainer_options,
                                      training_inputs,
)
from specdec.training.conversations import Example, chat_token_ids, tokenize_all
from specdec.training.distributed import (
                                      World,
                                      average_gradients,
                                      broadcast_parameters,
                                      every_rank,
                                      join,
                                      leave,
                                      sum_across,
)
from specdec.training.examples import ExampleDataset, load_examples
from specdec.training.loop import StepReport, Trainee, fit
from specdec.training.reporting import per_output
from specdec.training.schedule import warmup_cosine
from specdec.training.state import STATE_FILE, Position, Scores, TrainingOptions
from specdec.training.synthesize import prompt_turns, read_conversations
from specdec.training.target import FrozenTarget
from specdec.training.token_frequency import coverage, frequency_ranking, token_counts
from specdec.training.vocabulary import TrainingVocabulary, check_compact_vocabulary, projection

__all__ = [
    "DEFAULT_BASE", "DTYPES", "STATE_FILE", "ChainEvaluation", "Example", "ExampleDataset", "FrozenTarget",
    "LengthGroupedBatches", "Position", "Scores", "StepReport", "Trainee", "TrainingInputs", "TrainingOptions",
    "TrainingRun", "TrainingVocabulary", "World", "average_gradients", "broadcast_parameters", "chain_acceptance",
    "check_compact_vocabulary",
    "chained_loss", "chat_token_ids", "check_options", "collate", "conversation_lengths", "coverage", "evaluate_chain",
    "every_rank", "fit", "fit_options", "frequency_ranking", "join", "leave", "load_examples", "pad", "per_output",
    "projection", "prompt_turns", "read_conversations", "run_training", "saved_state", "shifted", "sum_across", "token_counts",
    "tokenize_all", "trainer_options", "training_inputs", "warmup_cosine",
]
