"""Offline mode's dump: the target's states for every training conversation, computed once.

A dump directory holds:

- ``index.json``: what was dumped (target config, fused layers, dtype) and which conversation
  lives in which shard, with its length. It is written last, so a directory without it is an
  interrupted dump, not a usable one.
- ``target.safetensors``: the target's input embedding, final norm and output layer
  (``embed_tokens.weight``, ``norm.weight``, ``lm_head.weight``). Training needs the embedding
  for the head's token input and the output layer to turn final states into the target's
  next-token logits, restricted to whatever draft vocabulary training picks.
- ``shard-NNNNN.safetensors``: per conversation ``n``: ``n.input_ids`` ``[T]``, ``n.loss_mask``
  ``[T]`` (assistant tokens), ``n.features`` ``[T, layers x hidden]`` (the states entering the
  fused decoder layers, ascending: runner ``hidden_states[i]``), ``n.final_hidden`` ``[T, hidden]``
  (the final normed state: logits = ``final_hidden @ lm_head.T``) and ``n.target_argmax`` ``[T]``
  (the target's greedy next token over its full vocabulary).

Storing the final state instead of logits keeps the dump ``hidden / vocab`` times smaller
(576 vs 49152 floats per token for SmolLM2) and leaves the draft vocabulary open until training.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec import ConfigError
from specdec.training import Example, pad

FORMAT = "specdec-eagle3-dump"
VERSION = 1
INDEX = "index.json"
TARGET_FILE = "target.safetensors"
FIELDS = ("input_ids", "loss_mask", "features", "final_hidden", "target_argmax")


def target_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The target weights training needs besides the dump: input embedding, final norm, output layer."""
    return {
        "embed_tokens.weight": model.get_input_embeddings().weight,
        "norm.weight": model.model.norm.weight,
        "lm_head.weight": model.get_output_embeddings().weight,
    }


@torch.no_grad()
def target_states(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor,
                  layers: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """One target forward over a right-padded batch: fused features, final states and greedy tokens."""
    out = model(input_ids=input_ids, attention_mask=attention, output_hidden_states=True, use_cache=False)
    hidden = out.hidden_states
    return {
        "features": torch.cat([hidden[i] for i in layers], dim=-1),
        "final_hidden": hidden[-1],
        "target_argmax": out.logits.argmax(-1),
    }


def _batches(examples: list[Example], batch_size: int) -> Iterator[list[Example]]:
    ordered = sorted(examples, key=lambda e: len(e.input_ids))
    for start in range(0, len(ordered), batch_size):
        yield ordered[start : start + batch_size]


def write_dump(
    model: torch.nn.Module,
    examples: list[Example],
    layers: tuple[int, ...],
    output: str | Path,
    *,
    target_name: str,
    batch_size: int = 4,
    shard_size: int = 256,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the target over ``examples`` and write a dump to ``output``; returns the index.

    ``on_batch(conversations, tokens)`` reports progress after each batch.
    """
    directory = Path(output)
    if (directory / INDEX).exists():
        raise ConfigError(f"--output: {str(directory)!r} already holds a dump; choose another directory")
    directory.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    # clone: tied embeddings (SmolLM2) share memory, which safetensors refuses to write twice
    save_file({k: v.detach().cpu().clone() for k, v in target_tensors(model).items()}, str(directory / TARGET_FILE))
    shards: list[dict[str, Any]] = []
    pending: dict[str, torch.Tensor] = {}
    entries: list[dict[str, Any]] = []

    def flush() -> None:
        if entries:
            name = f"shard-{len(shards):05d}.safetensors"
            save_file(pending, str(directory / name))
            shards.append({"file": name, "conversations": list(entries)})
            pending.clear()
            entries.clear()

    number = 0
    for batch in _batches(examples, batch_size):
        ids = pad([e.input_ids for e in batch]).to(device)
        attention = pad([torch.ones(len(e.input_ids), dtype=torch.long) for e in batch]).to(device)
        states = target_states(model, ids, attention, layers)
        for row, example in enumerate(batch):
            n = len(example.input_ids)
            key = str(number)
            pending[f"{key}.input_ids"] = example.input_ids.clone()
            pending[f"{key}.loss_mask"] = example.loss_mask.clone()
            for field in ("features", "final_hidden", "target_argmax"):
                pending[f"{key}.{field}"] = states[field][row, :n].detach().cpu().contiguous()
            entries.append({"key": key, "id": example.conversation_id, "length": n})
            number += 1
            if len(entries) >= shard_size:
                flush()
        if on_batch is not None:
            on_batch(len(batch), int(attention.sum()))
    flush()
    config = model.config
    index = {
        "format": FORMAT,
        "version": VERSION,
        "target": target_name,
        "target_config": json.loads(config.to_json_string()),
        "layers": list(layers),
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "conversations": number,
        "tokens": sum(c["length"] for s in shards for c in s["conversations"]),
        "shards": shards,
    }
    (directory / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return index


class DumpDataset(torch.utils.data.Dataset):
    """One or more dumps of the same target and layers (for example, made in parallel on several
    devices from parts of the data), read back conversation by conversation. Shards are opened
    lazily and memory-mapped."""

    def __init__(self, paths: str | Path | list[str | Path]) -> None:
        self.directories = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
        indexes = [read_index(d) for d in self.directories]
        self.index = indexes[0]
        for directory, other in zip(self.directories[1:], indexes[1:]):
            check_same_target(other, self.index, f"--offline-data {str(directory)!r}", repr(str(self.directories[0])))
        self._where = [(str(d / s["file"]), c["key"]) for d, index in zip(self.directories, indexes)
                       for s in index["shards"] for c in s["conversations"]]
        #: Each conversation's ``conversation_id``, in dataset order.
        self.ids = [str(c["id"]) for index in indexes for s in index["shards"] for c in s["conversations"]]
        #: Each conversation's length in tokens, in dataset order.
        self.lengths = [int(c["length"]) for index in indexes for s in index["shards"] for c in s["conversations"]]
        self._open: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._where)

    def _handle(self, file: str) -> Any:
        if file not in self._open:
            self._open[file] = safe_open(file, framework="pt")
        return self._open[file]

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        file, key = self._where[item]
        handle = self._handle(file)
        return {**{field: handle.get_tensor(f"{key}.{field}") for field in FIELDS}, "length": torch.tensor(self.lengths[item])}

    def target_tensors(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.directories[0] / TARGET_FILE))

    def sequences(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every conversation, without reading the states."""
        for file, key in self._where:
            handle = self._handle(file)
            yield handle.get_tensor(f"{key}.input_ids"), handle.get_tensor(f"{key}.loss_mask")


def check_same_target(index: dict[str, Any], reference: dict[str, Any], where: str, other: str) -> None:
    """A one-line error unless the dump ``index`` has the ``reference`` dump's target and layers."""
    for field in ("layers", "hidden_size", "vocab_size", "target"):
        if index[field] != reference[field]:
            raise ConfigError(f"{where}: its {field} {index[field]!r} differs from {other}'s {reference[field]!r}; "
                              "dumps must share a target and layers")


def read_index(directory: Path) -> dict[str, Any]:
    """The dump's index, checked; a one-line error for anything that is not a complete dump."""
    where = f"--offline-data {str(directory)!r}"
    if not directory.is_dir():
        raise ConfigError(f"{where}: not a directory")
    try:
        index = json.loads((directory / INDEX).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no {INDEX} (not a dump, or the dump was interrupted)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: {INDEX} is unreadable ({exc})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ConfigError(f"{where}: {INDEX} is not a specdec EAGLE-3 dump index")
    if index.get("version") != VERSION:
        raise ConfigError(f"{where}: dump version {index.get('version')!r}, this specdec reads version {VERSION}")
    missing = [s["file"] for s in index["shards"] if not (directory / s["file"]).exists()]
    if not (directory / TARGET_FILE).exists():
        missing.insert(0, TARGET_FILE)
    if missing:
        raise ConfigError(f"{where}: missing file {missing[0]}")
    if not index["conversations"]:
        raise ConfigError(f"{where}: the dump holds no conversations")
    return index
