"""``specdec train draft``: distil a small draft from the target's own answers.

The draft starts as a copy of a few of the target's decoder layers with the target's final norm
and (tied, frozen) embedding, so it shares the tokenizer and starts from features the target
already computes. Only the layers and the norm are trained, on conversations the target
answered itself (``specdec synthesize`` output). Two losses:

- ``kl`` (default): KL divergence from the target's next-token distribution, computed by the
  target in the same step, at every position of the conversation (prompt and reply): soft
  labels and every position teach, which matters when synthesized data is scarce (a CPU).
- ``ce``: cross-entropy on the tokens of every assistant turn (the target's own replies); no teacher forward.

Only the trained tensors are saved (bfloat16 safetensors, which the plugin ships and assembles
with the target's embedding).
"""

from __future__ import annotations

import math
import random
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec import ConfigError, Progress, load_model, resolve_device, resolve_dtype
from specdec.training import Example, chat_token_ids, prompt_turns, read_conversations, tokenize_all
from specdec_draft_target.shipped import EMBEDDING, PARD_EMBEDDING, WEIGHTS_FILE


def tokenize(records: list[dict[str, Any]], tokenizer: Any, max_length: int, prompts_only: bool = False) -> list[Example]:
    """Conversations -> token ids with every assistant token marked for the ``ce`` loss.

    ``prompts_only`` instead takes each conversation's prompt (up to its last user turn, with
    the generation prompt): text with no reply, useful to the ``kl`` loss only.
    """
    if not prompts_only:
        return tokenize_all(records, tokenizer, max_length)
    examples = []
    for record in records:
        ids = chat_token_ids(tokenizer, prompt_turns(record), True)[:max_length]
        examples.append(Example(str(record["conversation_id"]), torch.tensor(ids, dtype=torch.long),
                                torch.zeros(len(ids), dtype=torch.bool)))
    return examples


def build_draft(target: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """A copy of ``target`` keeping only ``layers`` (in order), with the embedding frozen."""
    from transformers import AutoModelForCausalLM

    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ConfigError(f"--layers: pick decoder layers of the target, each in 0..{n - 1}")
    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [target.config.layer_types[i] for i in layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = target.state_dict()
    state = {}
    for name, tensor in source.items():
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            if int(index) in layers:
                state[f"model.layers.{layers.index(int(index))}.{rest}"] = tensor.float()
        else:
            state[name] = tensor.float()
    draft.load_state_dict(state, strict=False)
    draft.tie_weights()
    draft.get_input_embeddings().weight.requires_grad_(False)
    draft.get_output_embeddings().weight.requires_grad_(False)
    return draft


def load_trained(draft: torch.nn.Module, weights: Path, layers: list[int]) -> int:
    """Load tensors written by :func:`save` into ``draft`` (built from ``layers``) to continue
    training them; returns the steps they had been trained for."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            meta = f.metadata() or {}
            state = {name: f.get_tensor(name).float() for name in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for a file that is not one
        raise ConfigError(f"--init: {weights} is not a safetensors file written by `specdec train draft` ({exc})") from None
    if meta.get("source_layers") != ",".join(map(str, layers)):
        raise ConfigError(f"--init: {weights} was trained from target layers {meta.get('source_layers')}, "
                          f"not --layers {','.join(map(str, layers))}")
    # A PARD draft's mask embedding (the shipped draft's) is no part of an autoregressive draft.
    state.pop(PARD_EMBEDDING, None)
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {EMBEDDING, "lm_head.weight"}:
        raise ConfigError(f"--init: {weights} does not fit this target's draft (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]})")
    return int(meta.get("steps", 0))


def trained_state(draft: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What ships: every tensor but the (frozen, target-owned) embedding and output layer."""
    return {name: t.detach().to(torch.bfloat16).contiguous() for name, t in draft.state_dict().items()
            if name not in (EMBEDDING, "lm_head.weight")}


def _batch(examples: list[Example], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, attention and ``loss_mask[p]``: position ``p`` predicts an assistant token."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = e.input_ids
        attention[row, : len(e.input_ids)] = 1
        loss_mask[row, : len(e.input_ids) - 1] = e.loss_mask[1:]
    return ids.to(device), attention.to(device), loss_mask.to(device)


def _kl_loss(draft: torch.nn.Module, teacher: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """KL(target || draft) over every real position that has a next token."""
    positions = attention.bool().clone()
    positions[:, -1] = False
    positions[:, :-1] &= attention[:, 1:].bool()
    with torch.no_grad():
        hidden = teacher.model(input_ids=ids, attention_mask=attention).last_hidden_state[positions]
        target_logp = torch.log_softmax(teacher.lm_head(hidden).float(), -1)
    hidden = draft.model(input_ids=ids, attention_mask=attention).last_hidden_state[positions]
    draft_logp = torch.log_softmax(draft.lm_head(hidden).float(), -1)
    return torch.nn.functional.kl_div(draft_logp, target_logp, log_target=True, reduction="batchmean")


def _loss_and_hits(draft: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor,
                   loss_mask: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    hidden = draft.model(input_ids=ids, attention_mask=attention).last_hidden_state
    labels = ids[:, 1:][loss_mask[:, :-1]]
    logits = draft.lm_head(hidden[loss_mask]).float()
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return loss, int((logits.argmax(-1) == labels).sum()), int(labels.numel())


def _batches(examples: list[Example], batch_size: int, rng: random.Random) -> list[list[Example]]:
    """Shuffled batches of similar length (sorted within windows of 16 batches)."""
    order = examples[:]
    rng.shuffle(order)
    window = batch_size * 16
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda e: len(e.input_ids))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


@torch.no_grad()
def evaluate(draft: torch.nn.Module, examples: list[Example], pad: int, device: torch.device, autocast: bool) -> float:
    """Top-1 agreement with the target's reply tokens (a per-token acceptance estimate)."""
    draft.eval()
    hits = total = 0
    for start in range(0, len(examples), 8):
        ids, attention, mask = _batch(examples[start : start + 8], pad, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            _, h, n = _loss_and_hits(draft, ids, attention, mask)
        hits, total = hits + h, total + n
    draft.train()
    return hits / max(total, 1)


def save(draft: torch.nn.Module, path: Path, layers: list[int], steps: int, accuracy: float) -> None:
    """Write the trained tensors; ``steps`` counts every step they were trained for, including
    those of a run continued with ``--init``."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "format": "pt",
        "num_hidden_layers": str(len(layers)),
        "source_layers": ",".join(map(str, layers)),
        "steps": str(steps),
        "heldout_top1_agreement": f"{accuracy:.4f}",
        "command": shlex.join(["specdec", *sys.argv[1:]]),
    }
    save_file(trained_state(draft), str(path), metadata=metadata)


@click.command("draft")
@click.option("--data", "data_paths", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl with the target's replies (from `specdec synthesize`); repeatable.")
@click.option("--prompts", "prompt_paths", multiple=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl whose prompts (no replies) add text for the kl loss; repeatable.")
@click.option("--output", default=str(WEIGHTS_FILE), show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the trained tensors (bf16 safetensors).")
@click.option("--model", default=None, help="Target: HF id or local dir (default: embedded SmolLM2-135M-Instruct).")
@click.option("--device", default=None, help="cuda or cpu (default: CUDA when present).")
@click.option("--layers", default="0,1,2,3,28,29", show_default=True, help="Target decoder layers the draft starts from.")
@click.option("--init", "init_weights", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Continue from tensors this command wrote (e.g. the shipped draft) instead of the target's layers; "
                   "they must come from the same --layers.")
@click.option("--steps", type=int, default=600, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--max-length", type=int, default=512, show_default=True, help="Truncate conversations to this many tokens.")
@click.option("--loss", "loss_kind", type=click.Choice(["kl", "ce"]), default="kl", show_default=True,
              help="kl: match the target's distribution at every position; ce: the target's reply tokens only.")
@click.option("--lr", type=float, default=5e-4, show_default=True)
@click.option("--heldout", type=int, default=64, show_default=True, help="Conversations held out to measure agreement.")
@click.option("--heldout-data", "heldout_paths", multiple=True, type=click.Path(dir_okay=False),
              help="Conversations jsonl to measure agreement on instead of --heldout of --data; --data conversations "
                   "with the same conversation_id are not trained on. Repeatable.")
@click.option("--eval-every", type=int, default=100, show_default=True, help="Measure and save every this many steps.")
@click.option("--seed", type=int, default=0, show_default=True)
def train_draft(data_paths, prompt_paths, output, model, device, layers, init_weights, steps, batch_size, max_length, loss_kind, lr, heldout,
                heldout_paths, eval_every, seed) -> None:
    """Distil a small draft model from the target's own replies."""
    try:
        layer_ids = [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers: expected comma-separated layer numbers, got {layers!r}") from None
    if min(steps, batch_size, max_length, eval_every) < 1 or lr <= 0 or heldout < 0:
        raise ConfigError("--steps, --batch-size, --max-length, --eval-every and --lr must be positive")
    console = Console(stderr=True)
    dev = resolve_device(device)
    # Master weights stay fp32; matrix products run in bf16 where the hardware has it.
    autocast = resolve_dtype("auto", dev) == torch.bfloat16
    torch.manual_seed(seed)
    rng = random.Random(seed)
    with console.status("loading the target and the data"):
        target, tokenizer = load_model(model, torch.float32, dev)
        records = [r for path in data_paths for r in read_conversations(path)]
        examples = tokenize(records, tokenizer, max_length)
        rng.shuffle(examples)
        if heldout_paths:
            held = tokenize([r for path in heldout_paths for r in read_conversations(path)], tokenizer, max_length)
            if not held:
                raise ConfigError("--heldout-data: no conversation ends in an assistant reply to measure agreement on")
        else:
            held, examples = examples[:heldout], examples[heldout:]
        # By id, not position: a file given twice (to weigh it more) must not train on a copy of
        # a held-out conversation.
        held_ids = {e.conversation_id for e in held}
        train = [e for e in examples if e.conversation_id not in held_ids]
        if len(train) < len(examples):
            console.print(f"{len(examples) - len(train)} --data conversations are held out: not trained on")
        if prompt_paths:
            if loss_kind != "kl":
                raise ConfigError("--prompts: prompts without replies only teach the kl loss")
            # Held-out conversations' prompts stay out of training too.
            extra = [r for path in prompt_paths for r in read_conversations(path) if str(r["conversation_id"]) not in held_ids]
            train += tokenize(extra, tokenizer, max_length, True)
        if not train:
            raise ConfigError("--data: no conversation ends in an assistant reply to train on")
        draft = build_draft(target, layer_ids)
        done = load_trained(draft, Path(init_weights), layer_ids) if init_weights else 0
        draft = draft.to(dev).train()
        teacher = target.requires_grad_(False) if loss_kind == "kl" else None
        del target
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    trainable = sum(p.numel() for p in params)
    start = f"continuing {init_weights} ({done} steps)" if init_weights else f"from target layers {layer_ids}"
    console.print(f"draft: {len(layer_ids)} layers {start}, {trainable / 1e6:.1f}M trained "
                  f"parameters; {len(train)} training / {len(held)} held-out conversations")
    accuracy = evaluate(draft, held, pad, dev, autocast) if held else float("nan")
    console.print(f"held-out top-1 agreement before training: {accuracy:.3f}")
    columns = (TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
               TextColumn("agree {task.fields[agree]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    batches: list[list[Example]] = []
    running = None
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=steps, loss=float("nan"), agree=accuracy)
        for step in range(1, steps + 1):
            if not batches:
                batches = _batches(train, batch_size, rng)
            ids, attention, mask = _batch(batches.pop(), pad, dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                if teacher is not None:
                    loss = _kl_loss(draft, teacher, ids, attention)
                else:
                    loss, _, _ = _loss_and_hits(draft, ids, attention, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            value = loss.item()
            running = value if running is None else 0.95 * running + 0.05 * value
            if step % eval_every == 0 or step == steps:
                if held:
                    accuracy = evaluate(draft, held, pad, dev, autocast)
                save(draft, Path(output), layer_ids, done + step, accuracy)
            progress.update(task, advance=1, loss=running, agree=accuracy)
    console.print(f"held-out top-1 agreement after {steps} steps: {accuracy:.3f}; wrote {output}")
