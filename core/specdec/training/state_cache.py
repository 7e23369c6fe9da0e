"""The target's final normed states on disk (the trainers' ``--cache-states``), so that epochs
after the first, and resumed runs, skip the target's forward. Medusa heads and MTP layers both
learn from exactly these states, so one cache serves either trainer.

The target is frozen, so its states for a conversation never change: every epoch after the
first would recompute exactly what the first computed. The cache directory holds
``shard-NNNNN.safetensors`` files (per conversation ``n``: ``n.hidden`` ``[T, hidden]``, in the
target's dtype) and ``index.json``, written last, so a directory without it is an interrupted
cache, made again. The index records the target and a fingerprint of the tokenized
conversations; a cache of other conversations or another target is refused rather than misused.
It costs ``hidden x 2`` bytes per token in bfloat16 (1,152 for SmolLM2-135M: 4.6 GB for 4M tokens).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.errors import ConfigError
from specdec.training.batching import collate
from specdec.training.examples import ExampleDataset

FORMAT = "specdec-target-states"
INDEX = "index.json"


def fingerprint(dataset: ExampleDataset) -> str:
    """A hash of every conversation's tokens and assistant mask, in order."""
    digest = hashlib.sha256()
    for ids, mask in dataset.sequences():
        digest.update(ids.numpy().tobytes())
        digest.update(mask.numpy().tobytes())
    return digest.hexdigest()


def _expected(dataset: ExampleDataset, target: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "target": target, "conversations": len(dataset), "fingerprint": fingerprint(dataset)}


def open_cache(directory: str | Path, dataset: ExampleDataset, target: dict[str, Any]) -> CachedStates | None:
    """``dataset`` with its final states from the complete cache in ``directory``; ``None`` when
    there is none yet, and a one-line error when it caches other conversations or another target.

    :param target: what identifies the target (name, hidden size, dtype, max length).
    """
    root = Path(directory)
    if not (root / INDEX).is_file():
        return None
    index = json.loads((root / INDEX).read_text())
    expected = _expected(dataset, target)
    differ = [k for k in expected if index.get(k) != expected[k]]
    if differ:
        raise ConfigError(f"--cache-states: {str(root)!r} caches other conversations or another target "
                          f"({', '.join(differ)} differ); give another directory")
    return CachedStates(dataset, root, index["where"])


def write_cache(directory: str | Path, dataset: ExampleDataset, states: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                target: dict[str, Any], batch_size: int, on_batch: Callable[[int], None] | None = None,
                shard_size: int = 256) -> CachedStates:
    """Run ``states`` over ``dataset`` (batches of similar length) and cache the results in
    ``directory``; ``on_batch`` gets the conversations of each batch written (progress)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(dataset)), key=lambda i: dataset.lengths[i])
    where: list[list[str]] = [[]] * len(dataset)
    pending: dict[str, torch.Tensor] = {}
    shard = 0
    for start in range(0, len(order), batch_size):
        items = order[start : start + batch_size]
        hidden = states(collate([dataset[i] for i in items])).cpu()
        for row, item in enumerate(items):
            pending[f"{item}.hidden"] = hidden[row, : dataset.lengths[item]].contiguous()
            where[item] = [f"shard-{shard:05d}.safetensors", f"{item}.hidden"]
        if len(pending) >= shard_size or start + batch_size >= len(order):
            save_file(pending, str(root / f"shard-{shard:05d}.safetensors"))
            pending, shard = {}, shard + 1
        if on_batch is not None:
            on_batch(len(items))
    (root / INDEX).write_text(json.dumps({**_expected(dataset, target), "where": where}) + "\n")
    return CachedStates(dataset, root, where)


class CachedStates(torch.utils.data.Dataset):
    """Conversations with their cached final states: item ``n`` is the dataset's plus ``hidden``."""

    def __init__(self, dataset: ExampleDataset, directory: Path, where: list[list[str]]) -> None:
        self.dataset = dataset
        self.directory = directory
        self.where = where
        #: Each conversation's length in tokens, in dataset order.
        self.lengths = dataset.lengths
        self._open: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        file, key = self.where[item]
        if file not in self._open:
            self._open[file] = safe_open(str(self.directory / file), framework="pt")
        return {**self.dataset[item], "hidden": self._open[file].get_tensor(key)}
