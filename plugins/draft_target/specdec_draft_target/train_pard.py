"""``specdec train pard``: turn an autoregressive draft into a PARD draft (:mod:`specdec_draft_target.pard`).

The draft keeps its weights and learns on conversations the target answered itself; the core
training loop runs it (resume, held-out curve, torch.distributed, target-state-free). The export is
a Hugging Face checkpoint as AMD publishes PARD drafts (``pard_token`` and ``spd_type: pard`` in
its config.json), which ``speculative_model`` loads with parallel drafting on. Started from the
shipped draft, it also writes the shipped form (``draft.safetensors``: the trained layers, the
norm and the mask token's embedding, which the plugin assembles with the target's embedding).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec import ConfigError, load_model
from specdec.training import (
    DTYPES,
    STATE_FILE,
    Scores,
    TrainingOptions,
    TrainingVocabulary,
    World,
    check_options,
    collate,
    conversation_lengths,
    fit_options,
    per_output,
    run_training,
    saved_state,
    sum_across,
    trainer_options,
    training_inputs,
)
from specdec_draft_target.pard import PardDraft, pard_layout, pard_loss
from specdec_draft_target.shipped import EMBEDDING, PARD_EMBEDDING, SHIPPED_MASK_TOKEN, WEIGHTS_FILE, shipped_draft_dir
from specdec_draft_target.vocab import check_same_tokenizer

#: The shipped form's file in ``--output`` (the plugin's ``weights/smollm2-draft.safetensors``).
SHIPPED_FORM = "draft.safetensors"


@dataclass
class PardOptions(TrainingOptions):
    lr: float = 1e-4
    #: Depths trained: drafts per forward (the mask runs hold ``depths - 1`` masks).
    depths: int = 4
    #: COD: copy ``j`` keeps ``max(keep ** j, keep_min)`` of its queries.
    keep: float = 0.7
    keep_min: float = 0.2


class PardTrainee:
    """A draft as the core loop trains it (:class:`specdec.training.loop.Trainee`)."""

    def __init__(self, module: PardDraft, options: PardOptions, vocabulary: TrainingVocabulary | None) -> None:
        self.module, self.options = module, options
        self.device = next(module.parameters()).device
        self.vocabulary = vocabulary.to(self.device) if vocabulary is not None else None
        #: Optimizer steps taken (a resumed run starts from the saved position).
        self.steps = 0

    def parameters(self) -> dict[str, torch.Tensor]:
        return self.module.trainable()

    def shape(self) -> dict[str, Any]:
        return {"depths": self.options.depths, "mask_token": self.module.mask_token}

    def loss(self, batch: dict[str, torch.Tensor]) -> Scores:
        self.steps += 1
        ids = batch["input_ids"].to(self.device)
        # The dropped queries follow from the batch and the seed alone, so a resumed run drops the same.
        generator = torch.Generator().manual_seed(self.options.seed * 1_000_003 + int(ids.sum()))
        layout = pard_layout(ids.shape[1], self.options.depths, self.options.keep, self.options.keep_min, generator)
        return pard_loss(self.module, ids, batch["loss_mask"], layout, self.options.depths, self.options.decay,
                         self.options.chunk, backward=True, bf16=self.options.bf16, vocabulary=self.vocabulary)

    @torch.no_grad()
    def evaluate(self, dataset: torch.utils.data.Dataset, world: World) -> Scores:
        """Per depth loss and top-1 accuracy over every query of ``dataset`` (no COD, whole
        vocabulary, float32), each rank a share."""
        self.module.eval()
        lengths = conversation_lengths(dataset)
        items = sorted(range(world.rank, len(dataset), world.size), key=lambda i: lengths[i])
        n = self.options.depths
        totals = [0.0] * (3 * n)
        for start in range(0, len(items), self.options.batch_size):
            batch = collate([dataset[i] for i in items[start : start + self.options.batch_size]])
            ids = batch["input_ids"].to(self.device)
            scores = pard_loss(self.module, ids, batch["loss_mask"], pard_layout(ids.shape[1], n), n,
                               chunk=self.options.chunk)
            totals = [t + v for t, v in zip(totals, [*scores.loss_sums, *scores.correct, *scores.counts])]
        totals = sum_across(totals, world)
        self.module.train()
        return Scores(totals[:n], [int(c) for c in totals[n : 2 * n]], [int(c) for c in totals[2 * n :]])


def export(module: PardDraft, tokenizer: Any, output: Path, dtype: torch.dtype, shipped_metadata: dict[str, str] | None,
           step: int, heldout: Scores | None) -> None:
    """The PARD draft as a Hugging Face checkpoint in ``output`` (AMD's layout); with
    ``shipped_metadata`` (started from the shipped draft) also the shipped form."""
    draft, token = module.draft, module.mask_token
    state = {name: t.detach().to(dtype) for name, t in draft.state_dict().items()}
    state[EMBEDDING] = state[EMBEDDING].clone()
    state[EMBEDDING][token] = module.mask_embedding.detach().to(dtype)
    if "lm_head.weight" in state and getattr(draft.config, "tie_word_embeddings", False):
        state["lm_head.weight"] = state[EMBEDDING]  # one tensor, whichever name the checkpoint keeps
    draft.config.pard_token = token
    draft.config.spd_type = "pard"
    draft.save_pretrained(output, state_dict=dict(state))  # which drops the tied output layer from what it gets
    if tokenizer is not None:
        tokenizer.save_pretrained(output)
    if shipped_metadata is not None:
        trained = {name: t.contiguous() for name, t in state.items() if name not in (EMBEDDING, "lm_head.weight")}
        trained[PARD_EMBEDDING] = module.mask_embedding.detach().to(torch.bfloat16).contiguous()
        metadata = {**shipped_metadata, "pard_token": str(token), "pard_steps": str(step),
                    "command": shlex.join(["specdec", *sys.argv[1:]])}
        if heldout is not None:
            metadata["heldout_top1_per_depth"] = per_output(heldout.accuracies())
        save_file({n: t.to(torch.bfloat16) for n, t in trained.items()}, str(output / SHIPPED_FORM), metadata=metadata)


@click.command("pard")
@trainer_options(output_help=f"Directory for the PARD draft (a Hugging Face checkpoint with pard_token), training.json "
                             f"and {STATE_FILE}.",
                 unit="depth", lr=1e-4, lr_help="Peak learning rate (AdamW).", decay=1.0,
                 decay_help="Depth j's loss weight: decay ** (j - 1).")
@click.option("--draft", default=None,
              help="The autoregressive draft to adapt: HF id or local dir sharing the target's tokenizer "
                   "(default, for the default target: the shipped SmolLM2 draft).")
@click.option("--depths", type=int, default=4, show_default=True,
              help="Tokens drafted per forward that training teaches (the last depth follows depths - 1 masks).")
@click.option("--mask-token", type=int, default=None,
              help="The token id the masks are (pard_token): a token chats never use. Default: the draft's own "
                   f"pard_token, or <empty_output> ({SHIPPED_MASK_TOKEN}) for the shipped draft.")
@click.option("--keep", type=click.FloatRange(0, 1, min_open=True), default=0.7, show_default=True,
              help="COD: the share of depth j's queries kept is keep ** (j - 1) (1 keeps every query).")
@click.option("--keep-min", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="COD: the least share of queries kept at any depth.")
def train_pard(draft: str | None, depths: int, mask_token: int | None, keep: float, keep_min: float, **common) -> None:
    """Adapt an autoregressive draft into a PARD draft that drafts --depths tokens in one forward."""
    output = Path(common["output"])
    check_options({"depths": depths}, **common)
    with training_inputs(**common) as inputs:
        world, tokenizer = inputs.world, inputs.tokenizer
        shipped_metadata = None
        if draft is None:
            if common["model"] is not None:
                raise ConfigError("--draft: required; a draft ships only for the default target (SmolLM2-135M-Instruct)")
            with safe_open(str(WEIGHTS_FILE), "pt") as f:
                shipped_metadata = {k: v for k, v in (f.metadata() or {}).items()
                                    if k in ("format", "num_hidden_layers", "source_layers")}
            path = str(shipped_draft_dir())
        else:
            path = draft
        model, draft_tokenizer = load_model(path, torch.float32, world.device)
        check_same_tokenizer(draft_tokenizer, tokenizer, int(model.get_output_embeddings().weight.shape[0]),
                             int(inputs.target.get_output_embeddings().weight.shape[0]), path)
        del inputs.target
        token = mask_token if mask_token is not None else getattr(model.config, "pard_token", None)
        if token is None:
            if shipped_metadata is None:
                raise ConfigError("--mask-token: required for a draft that is not a PARD draft yet (a token id chats never use)")
            token = SHIPPED_MASK_TOKEN
        size = int(model.get_input_embeddings().weight.shape[0])
        if not 0 <= token < size:
            raise ConfigError(f"--mask-token: {token} is not a token id of the draft (0..{size - 1})")
        model.get_input_embeddings().weight.requires_grad_(False)
        model.get_output_embeddings().weight.requires_grad_(False)
        module = PardDraft(model, token).to(world.device).train()
        options = replace(fit_options(PardOptions, inputs, **common), depths=depths, keep=keep, keep_min=keep_min)
        saved = saved_state(str(output), common["resume"], {"depths": depths, "mask_token": token}, str)
        inputs.console.print(f"adapting {path} ({model.config.num_hidden_layers} layers) into a PARD draft of {depths} "
                             f"depths, mask token {token}: {inputs.summary(options)}")
        export_dtype = DTYPES[common["export_dtype"]]
        last: dict[str, Any] = {}
        trainee = PardTrainee(module, options, inputs.vocabulary)

        def heldout_fields(scores: Scores) -> dict[str, Any]:
            last["heldout"] = scores
            return {"heldout_loss_per_depth": scores.losses(), "heldout_accuracy_per_depth": scores.accuracies()}

        def held_line(step: int, scores: Scores) -> str:
            return f"step {step}: held-out loss per depth {per_output(scores.losses())}, top-1 {per_output(scores.accuracies())}"

        trainee.steps = saved["position"]["step"] if saved is not None else 0

        def save() -> None:
            export(module, draft_tokenizer, output, export_dtype, shipped_metadata, trainee.steps, last.get("heldout"))

        run_training(trainee, inputs, options, str(output), saved, save, "depth", heldout_fields, held_line,
                     {"draft": path, "mask_token": token, "depths": depths}, common["data"], common["eval_data"])
        inputs.console.print(f"wrote the PARD draft ({common['export_dtype']}) to {output}")
