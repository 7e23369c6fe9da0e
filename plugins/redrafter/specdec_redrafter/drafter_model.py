"""The recurrent drafter and its checkpoints, in apple/ml-recurrent-drafter's layout.

``config.json``: ``model_type: recurrent_drafting_drafter``, ``hidden_size`` (the target's, H),
``vocab_size`` (the target's), ``exit_dim`` (the MLP's width; Apple's trainer makes it 2H),
``num_draft_layers`` (residual blocks before the output layer) and ``rnn`` (a recurrent state, or
a running sum of embeddings); optionally ``redrafter_num_beams`` and
``redrafter_draft_len_per_beam``, the beam search the drafter is meant for (TensorRT-LLM's
converted checkpoints carry them), which drafting uses unless its options say otherwise.
``num_lookback_tokens`` (never read by Apple's code), MLX's ``emb_norm`` and ``rms_norm_eps`` (its
norm is never applied) and Hugging Face's bookkeeping are accepted and unused; any other field is
an error naming it.

Weights (``model.safetensors``): ``input_proj.{weight,bias}`` [exit_dim, 2H] only when
``exit_dim != 2H``; ``lm_head.{i}.linear.{weight,bias}`` [exit_dim, exit_dim] for each block;
``lm_head.{N}.weight`` [vocab, exit_dim] (N = ``num_draft_layers``, no bias); with ``rnn``,
``rnn_u.{weight,bias}`` and ``rnn_w.weight`` [H, H]. TensorRT-LLM's converter's names are read too:
``drafter.``-prefixed, ``drafter.layers.{i}.linear`` for the blocks and ``drafter.lm_head`` for the
output layer, and ``lm_heads.`` / ``input_projs.``.

The drafter embeds tokens with the target's own embedding table. From the target's final (normed)
hidden state ``h`` at the last committed token and that token, each draft position::

    s = SiLU(rnn_w(E(token)) + rnn_u(s))        # s starts at 0; without rnn: s = s + E(token)
    x = [h, s]                                  # concatenated, h first
    x = input_proj(x)                           # only when exit_dim != 2H
    x = x + SiLU(linear_i(x))                   # for each block i
    logits = lm_head_N(x)

as Apple's torch and MLX code compute it (its paper writes ``[s, h]``; the checkpoints follow the
code). Beam search scores with the log-softmax of the logits kept to their top 50, as Apple's
inference does.

**Compact checkpoints** (specdec's own, for a drafter trained over a draft vocabulary): ``config.json``
adds ``draft_vocab_size`` ``V``, the weights hold ``token_ids`` [V] (the vocabulary's target ids,
ascending) and an output layer ``lm_head.{N}.weight`` of their V rows only. For SmolLM2 that
layer is 49,152 rows in Apple's layout, nearly all of the drafter; Apple's code does not read
such a file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from torch import nn
from torch.nn import functional as F

from specdec import ConfigError, ModelLoadError, compact_token_ids, trimmed_projection

MODEL_TYPE = "recurrent_drafting_drafter"
_IGNORED_FIELDS = {"model_type", "architectures", "torch_dtype", "dtype", "transformers_version",
                   "num_lookback_tokens", "emb_norm", "rms_norm_eps"}
#: Apple's inference keeps each draft distribution to its 50 best tokens before the log-softmax.
TOP_K = 50
_MASKED = -50000.0


@dataclass
class DrafterSpec:
    """What a checkpoint's ``config.json`` declares."""

    hidden_size: int
    vocab_size: int
    exit_dim: int
    num_draft_layers: int
    rnn: bool = True
    #: A compact checkpoint's draft vocabulary size (0: the output layer covers the whole vocabulary).
    draft_vocab_size: int = 0
    #: The beams and draft length the drafter was tuned for (TensorRT-LLM's converted checkpoints
    #: carry them in their config); 0: not given.
    redrafter_num_beams: int = 0
    redrafter_draft_len_per_beam: int = 0


class ResBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class RecurrentDrafter(nn.Module):
    """ReDrafter's drafter: a recurrent state over the drafted tokens' embeddings, read with the
    target's hidden state by a residual MLP and an output layer over the vocabulary, or with
    ``token_ids`` over those target ids only (a compact drafter, trained over a draft vocabulary)."""

    def __init__(self, spec: DrafterSpec, token_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.spec = replace(spec, draft_vocab_size=0)
        hidden, width = spec.hidden_size, spec.exit_dim
        #: The target id each output row stands for, ascending (``None``: row ``i`` is id ``i``).
        self.token_ids = None if token_ids is None else token_ids.sort().values.cpu()
        rows = spec.vocab_size if token_ids is None else len(token_ids)
        self.input_proj = nn.Linear(2 * hidden, width) if width != 2 * hidden else None
        self.lm_head = nn.Sequential(*(ResBlock(width) for _ in range(spec.num_draft_layers)),
                                     nn.Linear(width, rows, bias=False))
        if spec.rnn:
            self.rnn_u = nn.Linear(hidden, hidden)
            self.rnn_w = nn.Linear(hidden, hidden, bias=False)

    @torch.no_grad()
    def narrowed(self, ids: torch.Tensor) -> RecurrentDrafter:
        """This drafter over the target ids ``ids`` only: a compact drafter (trainable) whose output
        layer keeps their rows. Training over a draft vocabulary steps those rows alone."""
        compact = RecurrentDrafter(self.spec, ids)
        theirs = dict(self.named_parameters())
        for name, parameter in compact.named_parameters():
            source = theirs[name].to(parameter.dtype)
            parameter.copy_(source[compact.token_ids.to(source.device)] if name == self._output_name else source)
        return compact.to(next(self.parameters()).device)

    @torch.no_grad()
    def export(self) -> RecurrentDrafter:
        """A compact drafter in Apple's full layout: the output rows of the other ids are zero, so
        drafting over the same draft vocabulary drafts exactly as the compact drafter does."""
        if self.token_ids is None:
            return self
        full = RecurrentDrafter(self.spec).to(next(self.parameters()).device)
        mine = dict(self.named_parameters())
        for name, parameter in full.named_parameters():
            if name == self._output_name:
                parameter.zero_()
                parameter[self.token_ids.to(parameter.device)] = mine[name]
            else:
                parameter.copy_(mine[name])
        return full.eval()

    @property
    def _output_name(self) -> str:
        return f"lm_head.{self.spec.num_draft_layers}.weight"

    def advance(self, state: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """The state after a token whose embedding is ``embedded`` (both ``[..., H]``)."""
        if self.spec.rnn:
            return F.silu(self.rnn_w(embedded) + self.rnn_u(state))
        return state + embedded

    def features(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """What the output layer reads: ``[h, s]`` through the input projection and the blocks."""
        x = torch.cat([hidden, state], dim=-1)
        if self.input_proj is not None:
            x = self.input_proj(x)
        return self.lm_head[:-1](x)

    @property
    def output(self) -> nn.Linear:
        """The output layer over the vocabulary (``lm_head.{N}``)."""
        return self.lm_head[-1]

    def logits(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary (the kept tokens after :meth:`narrow_vocabulary`) from the
        target's hidden state and the drafter's state."""
        return self.output(self.features(hidden, state))

    def narrow_vocabulary(self, rows: torch.Tensor) -> None:
        """Score only the output rows ``rows`` (a draft vocabulary; for a full drafter the target
        ids themselves): the output layer keeps them, and :meth:`logits` index into ``rows``.
        Call once on the device and dtype."""
        self.lm_head[-1] = trimmed_projection(self.output, rows)

    def reset_parameters(self) -> None:
        """A fresh drafter for training: PyTorch's default initialisation of every layer."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()


def beam_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Float32 log-probabilities of ``logits`` kept to their top :data:`TOP_K` (Apple's scoring)."""
    logits = logits.float()
    if logits.shape[-1] > TOP_K:
        kth = logits.topk(TOP_K, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, _MASKED)
    return logits.log_softmax(-1)


def read_spec(directory: Path) -> DrafterSpec:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ModelLoadError(f"speculative_model: no ReDrafter config at {path} ({exc.strerror})") from None
    except ValueError as exc:
        raise ModelLoadError(f"speculative_model: {path} is not valid JSON ({exc})") from None
    if config.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"model_type: {config.get('model_type')!r} in {path}; a ReDrafter drafter has {MODEL_TYPE!r}")
    known = set(DrafterSpec.__dataclass_fields__) | _IGNORED_FIELDS
    for name in config:
        if name not in known and not name.startswith("_"):
            raise ConfigError(f"{name}: unknown field in {path} (a ReDrafter config has {', '.join(sorted(known))})")
    for name in ("hidden_size", "vocab_size", "exit_dim"):
        if not isinstance(config.get(name), int) or isinstance(config.get(name), bool) or config[name] < 1:
            raise ConfigError(f"{name}: must be a positive integer in {path}, got {config.get(name)!r}")
    layers = config.get("num_draft_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise ConfigError(f"num_draft_layers: must be a non-negative integer in {path}, got {layers!r}")
    if not isinstance(config.get("rnn", True), bool):
        raise ConfigError(f"rnn: must be true or false in {path}, got {config['rnn']!r}")
    draft = config.get("draft_vocab_size", 0)
    if not isinstance(draft, int) or isinstance(draft, bool) or not 0 <= draft < config["vocab_size"]:
        raise ConfigError(f"draft_vocab_size: must be an integer from 0 to below vocab_size in {path}, got {draft!r}")
    for name in ("redrafter_num_beams", "redrafter_draft_len_per_beam"):
        if not isinstance(config.get(name, 0), int) or isinstance(config.get(name), bool) or config.get(name, 0) < 0:
            raise ConfigError(f"{name}: must be a non-negative integer in {path} (0: not given), got {config[name]!r}")
    return DrafterSpec(config["hidden_size"], config["vocab_size"], config["exit_dim"], layers, config.get("rnn", True),
                       draft, config.get("redrafter_num_beams", 0), config.get("redrafter_draft_len_per_beam", 0))


def _apple_name(name: str, num_layers: int) -> str | None:
    """A tensor's name in Apple's layout (TensorRT-LLM's converted names mapped back), or ``None``
    for a tensor the drafter does not use (MLX's ``emb_norm``)."""
    name = name.removeprefix("drafter.")
    if name.startswith("emb_norm."):
        return None
    if name.startswith("layers."):
        return "lm_head." + name.removeprefix("layers.")
    if name == "lm_head.weight":
        return f"lm_head.{num_layers}.weight"
    for plural, singular in (("lm_heads.", "lm_head."), ("input_projs.", "input_proj.")):
        if name.startswith(plural):
            return singular + name.removeprefix(plural)
    return name


def load_drafter(source: str | Path, hidden_size: int, vocab_size: int) -> RecurrentDrafter:
    """The drafter in directory ``source``, checked against a target of ``hidden_size`` and ``vocab_size``."""
    directory = Path(source)
    spec = read_spec(directory)
    if spec.hidden_size != hidden_size:
        raise ConfigError(f"hidden_size: the drafter reads hidden states of {spec.hidden_size}, the target's are {hidden_size}")
    if spec.vocab_size != vocab_size:
        raise ConfigError(f"vocab_size: the drafter's is {spec.vocab_size}, the target's {vocab_size}")
    path = directory / "model.safetensors"
    if not path.exists():
        raise ModelLoadError(f"speculative_model: no weights in {directory} (expected model.safetensors)")
    tensors = {}
    for name, tensor in load_file(path).items():
        mapped = _apple_name(name, spec.num_draft_layers)
        if mapped is not None:
            tensors[mapped] = tensor
    token_ids = tensors.pop("token_ids", None)
    if spec.draft_vocab_size:
        token_ids = compact_token_ids({"token_ids": token_ids} if token_ids is not None else {}, spec.draft_vocab_size,
                                      spec.vocab_size, directory)
    elif token_ids is not None:
        raise ModelLoadError(f"token_ids: in the drafter's weights in {directory}, but its config sets no draft_vocab_size")
    model = RecurrentDrafter(spec, token_ids)
    expected = dict(model.named_parameters())
    for name in tensors:
        if name not in expected:
            raise ModelLoadError(f"{name}: unexpected in the drafter's weights in {directory} (its config makes "
                                 f"{', '.join(expected)})")
    with torch.no_grad():
        for name, parameter in expected.items():
            tensor = tensors.get(name)
            if tensor is None:
                raise ModelLoadError(f"{name}: missing from the drafter's weights in {directory}")
            if tensor.shape != parameter.shape:
                raise ModelLoadError(f"{name}: shape {list(tensor.shape)} in {directory}, expected {list(parameter.shape)}")
            parameter.copy_(tensor)
    return model.eval()


def save_drafter(model: RecurrentDrafter, directory: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``model`` in Apple's layout (``config.json``, ``model.safetensors``), cast to ``dtype``;
    a compact drafter as a compact checkpoint (module docstring)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    compact = model.token_ids is not None
    optional = ("draft_vocab_size", "redrafter_num_beams", "redrafter_draft_len_per_beam")
    spec = {k: v for k, v in asdict(model.spec).items() if k not in optional or v}
    if compact:
        spec["draft_vocab_size"] = len(model.token_ids)
    config = {"architectures": ["Drafter"], "model_type": MODEL_TYPE, **spec, "torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: p.detach().to(dtype).cpu().contiguous() for name, p in model.named_parameters()}
    if compact:
        tensors["token_ids"] = model.token_ids.to(torch.int64).contiguous()
    save_file(tensors, directory / "model.safetensors")
    return directory
