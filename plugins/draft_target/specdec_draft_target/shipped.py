"""The draft shipped for the default target (SmolLM2-135M-Instruct).

The package carries only what training changed: a few decoder layers and the final norm, in
bfloat16 (``weights/smollm2-draft.safetensors``; its metadata records which target layers it
started from and how it was trained). The embedding, tied to the output layer and frozen during
training, is the target's own: on first use it is read from the cached default model and a full
Hugging Face checkpoint is assembled in the cache directory, so ``speculative_model`` and
``transformers``' ``assistant_model`` load the very same weights.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import torch

from specdec import DEFAULT_MODEL, ModelLoadError, cache_dir, default_model_dir

WEIGHTS_FILE = Path(__file__).resolve().parent / "weights" / "smollm2-draft.safetensors"
EMBEDDING = "model.embed_tokens.weight"
#: A PARD draft's mask token embedding, in the shipped form (its metadata names the token).
PARD_EMBEDDING = "pard_embedding"
#: SmolLM2's ``<empty_output>``, a Jupyter token that chats never use: the shipped PARD draft's mask token.
SHIPPED_MASK_TOKEN = 16


def shipped_draft_dir(weights: Path = WEIGHTS_FILE) -> Path:
    """A full checkpoint directory of the shipped draft, assembled on first use."""
    if not weights.exists():
        raise ModelLoadError(f"the shipped draft weights are missing: {weights} (reinstall specdec-plugin-draft-target)")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{DEFAULT_MODEL}-draft-{digest}"
    if (target / "model.safetensors").exists():
        return target
    assemble_draft(weights, default_model_dir(), target)
    return target


def assemble_draft(weights: Path, target_dir: Path, out_dir: Path) -> None:
    """Write a checkpoint of the draft: ``weights`` plus the target's embedding, config and tokenizer."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata() or {}
    num_layers = int(metadata["num_hidden_layers"])
    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        embedding = f.get_tensor(EMBEDDING)
    config = AutoConfig.from_pretrained(target_dir)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    state = {name: t.float() for name, t in load_file(str(weights)).items()}
    state[EMBEDDING] = embedding.float()
    if "pard_token" in metadata:  # a PARD draft: its mask token's embedding was trained
        config.pard_token, config.spd_type = int(metadata["pard_token"]), "pard"
        state[EMBEDDING][config.pard_token] = state.pop(PARD_EMBEDDING)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ModelLoadError(f"shipped draft weights do not fit the draft model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".draft-"))
    try:
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(target_dir).save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
