"""The MLP speculator and its checkpoints, as IBM publishes them (``*-accelerator``) and vLLM loads them.

``config.json``: ``model_type: mlp_speculator``, ``emb_dim`` (the target's hidden size),
``inner_dim`` (0: ``emb_dim``), ``n_predict`` (stages), ``vocab_size``, ``tie_weights``,
``scale_input`` and ``top_k_tokens_per_head``; ``n_candidates`` and Hugging Face's bookkeeping
(``architectures``, ``torch_dtype``, ``transformers_version``) are accepted and unused. Any other
field is an error naming it.

Weights of stage ``i``: ``emb.{i}.weight`` [vocab, inner], ``proj.{i}.weight`` ([inner, emb_dim] for
stage 0, else [inner, inner]), ``head.{i}.weight`` [vocab, inner], ``ln.{i}.weight`` and
``ln.{i}.bias`` [inner], optionally prefixed ``speculator.``. With ``tie_weights`` every stage
shares stage 0's ``emb``, ``head`` and ``ln``, and stages 1 on share ``proj.1``; a file may then
hold each shared tensor once (under its first stage's name).

A stage reads the previous stage's state (the first: the target's final hidden state at the
last committed token's predicting row) and the token the previous stage chose (the first: the
last committed token)::

    state = proj_i(state) + emb_i(token) * emb_weight / state_weight
    state = GELU(ln_i(state))          # ln: x / sqrt(mean(x^2) + 1e-6), then weight * x + bias
    logits = head_i(state)

with ``state_weight = 0.5 ** (0.5 / n_predict)`` and ``emb_weight = sqrt((1 - state_weight^2) *
inner_dim / 2)``. With ``scale_input`` the first state is ``ln0(hidden) / sqrt(2)``, an ``ln``
without weight or bias.

**Compact checkpoints** (specdec's own, for a speculator trained over a draft vocabulary: see
:class:`CompactSpeculator`): ``config.json`` adds ``draft_vocab_size`` ``V``, and the weights hold
``token_ids`` [V] (the vocabulary's target ids, ascending), ``head.{i}.weight`` [V, inner] and
``emb.{i}.weight`` [V + 1, inner], whose last row every other token reads, each tied tensor once
(under its first stage's name). Loading one gives the
speculator IBM's full layout would hold, a sixth of the size on disk; vLLM does not read it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from specdec import ConfigError, ModelLoadError, compact_token_ids, trimmed_projection

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_IGNORED_FIELDS = {"architectures", "torch_dtype", "transformers_version", "n_candidates", "model_type"}
_EPS = 1e-6


@dataclass
class SpeculatorSpec:
    """What a checkpoint's ``config.json`` declares."""

    emb_dim: int
    inner_dim: int
    n_predict: int
    vocab_size: int
    tie_weights: bool = False
    scale_input: bool = False
    top_k_tokens_per_head: list[int] = field(default_factory=list)
    #: A compact checkpoint's draft vocabulary (module docstring); 0 for IBM's full layout.
    draft_vocab_size: int = 0


def _norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _EPS)


class ScaledNorm(nn.Module):
    """The speculator's layer norm: RMS normalisation, then an elementwise scale and shift."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * _norm(x.float()).type_as(x) + self.bias


class MLPSpeculator(nn.Module):
    def __init__(self, spec: SpeculatorSpec) -> None:
        super().__init__()
        self.spec = spec
        n, inner = spec.n_predict, spec.inner_dim

        def stages(make, first_apart: bool = False) -> nn.ModuleList:
            if not spec.tie_weights:
                return nn.ModuleList([make(i) for i in range(n)])
            if first_apart:
                shared = make(1) if n > 1 else None
                return nn.ModuleList([make(0)] + [shared] * (n - 1))
            return nn.ModuleList([make(0)] * n)

        self.emb = stages(lambda i: nn.Embedding(spec.vocab_size, inner))
        self.proj = stages(lambda i: nn.Linear(spec.emb_dim if i == 0 else inner, inner, bias=False), first_apart=True)
        self.head = stages(lambda i: nn.Linear(inner, spec.vocab_size, bias=False))
        self.ln = stages(lambda i: ScaledNorm(inner))
        state_weight = 0.5 ** (0.5 / n)
        self.emb_scale = math.sqrt((1 - state_weight**2) * inner / 2) / state_weight
        #: The target ids of the output layers' rows once narrowed to a draft vocabulary, else ``None``.
        self.token_map: torch.Tensor | None = None

    def narrow_vocabulary(self, kept: torch.Tensor) -> None:
        """Score only the target ids ``kept`` (a draft vocabulary, ``specdec.draft_vocabulary``):
        each output layer keeps their rows (tied stages: one copy). Call once on the device and dtype."""
        trimmed = {id(head): trimmed_projection(head, kept) for head in self.head}
        self.head = nn.ModuleList(trimmed[id(head)] for head in self.head)
        self.token_map = kept.to(self.head[0].weight.device)

    def first_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """Stage 0's input state from the target's hidden states ``[..., emb_dim]``."""
        if self.spec.scale_input:
            return _norm(hidden.float()).type_as(hidden) / math.sqrt(2)
        return hidden

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Stage ``stage``'s state from the previous state ``[..., in]`` and the chosen ``tokens`` ``[...]``."""
        return F.gelu(self.ln[stage](self.proj[stage](state) + self.emb[stage](tokens) * self.emb_scale))

    def step(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage ``stage``'s new state and its logits over the vocabulary."""
        state = self.advance(stage, state, tokens)
        return state, self.head[stage](state)

    def reset_parameters(self) -> None:
        """IBM's initialisation for training: weights ``N(0, 1 / inner_dim)``, norms the identity."""
        std = 1 / math.sqrt(self.spec.inner_dim)
        for module in self.modules():
            if isinstance(module, (nn.Embedding, nn.Linear)):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, ScaledNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


class CompactSpeculator(MLPSpeculator):
    """An MLP speculator of ``spec`` over a draft vocabulary, the target ids ``ids``: its output
    layers hold their rows only (``token_map``), its embeddings theirs and one row that every
    other id shares (stage 0 reads the last committed token, which can be any).

    A stage's embedding and output layer are ``vocab x inner`` each, for SmolLM2 two 49,152-row
    matrices that dwarf the rest. Trained over the 8,192 tokens it will draft over, a speculator
    needs only their rows: the optimizer steps a sixth of the weights, and the compact checkpoint
    is a sixth of the size. :meth:`export` gives the same speculator in IBM's full layout: the
    embedding rows outside the vocabulary are the shared one and the output rows zero, so drafting
    over the same draft vocabulary drafts exactly as this one does (over the whole vocabulary,
    the other tokens score 0)."""

    def __init__(self, spec: SpeculatorSpec, ids: torch.Tensor) -> None:
        ids = ids.sort().values.cpu()
        super().__init__(replace(spec, vocab_size=len(ids) + 1))
        self.full_spec = spec
        heads = {id(head): nn.Linear(spec.inner_dim, len(ids), bias=False) for head in self.head}
        self.head = nn.ModuleList(heads[id(head)] for head in self.head)  # tied stages keep one head
        rows = torch.full((spec.vocab_size,), len(ids), dtype=torch.long)
        rows[ids] = torch.arange(len(ids))
        #: Each target id's embedding row.
        self.register_buffer("rows", rows, persistent=False)
        self.token_map = ids

    @classmethod
    @torch.no_grad()
    def narrowed(cls, full: MLPSpeculator, ids: torch.Tensor) -> CompactSpeculator:
        """``full`` over the vocabulary ``ids``: their output and embedding rows, and as the shared
        embedding row the mean of the others."""
        compact = cls(full.spec, ids)
        ids, rows = compact.token_map, compact.rows
        others = rows == len(ids)
        theirs = dict(full.named_parameters(remove_duplicate=False))
        for name, parameter in compact.named_parameters(remove_duplicate=False):
            source = theirs[name].to(parameter.dtype).cpu()
            if name.startswith("emb."):
                parameter.copy_(torch.cat([source[ids], source[others].mean(0, keepdim=True)]))
            elif name.startswith("head."):
                parameter.copy_(source[ids])
            else:
                parameter.copy_(source)
        return compact

    def advance(self, stage: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return super().advance(stage, state, self.rows[tokens])

    @torch.no_grad()
    def export(self) -> MLPSpeculator:
        """The same speculator over the whole vocabulary, in IBM's layout (class docstring)."""
        full = MLPSpeculator(self.full_spec).to(self.rows.device)
        ids = self.token_map.to(self.rows.device)
        mine = dict(self.named_parameters(remove_duplicate=False))
        for name, parameter in full.named_parameters(remove_duplicate=False):
            source = mine[name]
            if name.startswith("emb."):
                parameter.copy_(source[self.rows])
            elif name.startswith("head."):
                parameter.zero_()
                parameter[ids] = source
            else:
                parameter.copy_(source)
        return full.eval()


def read_spec(directory: Path) -> SpeculatorSpec:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ModelLoadError(f"speculative_model: no MLP speculator config at {path} ({exc.strerror})") from None
    except ValueError as exc:
        raise ModelLoadError(f"speculative_model: {path} is not valid JSON ({exc})") from None
    if config.get("model_type") != "mlp_speculator":
        raise ConfigError(f"model_type: {config.get('model_type')!r} in {path}; an MLP speculator has 'mlp_speculator'")
    known = set(SpeculatorSpec.__dataclass_fields__) | _IGNORED_FIELDS
    for name in config:
        if name not in known:
            raise ConfigError(f"{name}: unknown field in {path} (an MLP speculator's config has {', '.join(sorted(known))})")
    for name in ("emb_dim", "n_predict", "vocab_size"):
        if not isinstance(config.get(name), int) or config[name] < 1:
            raise ConfigError(f"{name}: must be a positive integer in {path}, got {config.get(name)!r}")
    inner = config.get("inner_dim", 0)
    if not isinstance(inner, int) or inner < 0:
        raise ConfigError(f"inner_dim: must be a non-negative integer in {path}, got {inner!r}")
    top_k = config.get("top_k_tokens_per_head", [])
    if not (isinstance(top_k, list) and all(isinstance(k, int) and k >= 1 for k in top_k)):
        raise ConfigError(f"top_k_tokens_per_head: must be a list of positive integers in {path}, got {top_k!r}")
    if top_k and len(top_k) != config["n_predict"]:
        raise ConfigError(f"top_k_tokens_per_head: {len(top_k)} entries for n_predict {config['n_predict']} in {path}")
    for name in ("tie_weights", "scale_input"):
        if not isinstance(config.get(name, False), bool):
            raise ConfigError(f"{name}: must be true or false in {path}, got {config[name]!r}")
    draft = config.get("draft_vocab_size", 0)
    if not isinstance(draft, int) or not 0 <= draft < config["vocab_size"]:
        raise ConfigError(f"draft_vocab_size: must be an integer from 0 to below vocab_size in {path}, got {draft!r}")
    return SpeculatorSpec(config["emb_dim"], inner or config["emb_dim"], config["n_predict"], config["vocab_size"],
                          config.get("tie_weights", False), config.get("scale_input", False), top_k, draft)


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.exists():
            tensors = load_file(path) if name.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)
            return {key.removeprefix("speculator."): value for key, value in tensors.items()}
    raise ModelLoadError(f"speculative_model: no weights in {directory} (expected {' or '.join(WEIGHT_FILES)})")


def load_speculator(source: str | Path, hidden_size: int, vocab_size: int) -> MLPSpeculator:
    """The speculator in directory ``source``, checked against a target of ``hidden_size`` and ``vocab_size``."""
    directory = Path(source)
    spec = read_spec(directory)
    if spec.emb_dim != hidden_size:
        raise ConfigError(f"emb_dim: the speculator reads hidden states of {spec.emb_dim}, the target's are {hidden_size}")
    if spec.vocab_size != vocab_size:
        raise ConfigError(f"vocab_size: the speculator's is {spec.vocab_size}, the target's {vocab_size}")
    tensors = _read_tensors(directory)
    model = MLPSpeculator(spec) if not spec.draft_vocab_size else \
        CompactSpeculator(replace(spec, draft_vocab_size=0),
                          compact_token_ids(tensors, spec.draft_vocab_size, spec.vocab_size, directory))
    with torch.no_grad():
        for name, parameter in model.named_parameters(remove_duplicate=False):
            tensor = tensors.get(name)
            if tensor is None and spec.tie_weights:
                tensor = tensors.get(_first_tied_name(name))
            if tensor is None:
                raise ModelLoadError(f"{name}: missing from the speculator's weights in {directory}")
            if tensor.shape != parameter.shape:
                raise ModelLoadError(f"{name}: shape {list(tensor.shape)} in {directory}, expected {list(parameter.shape)}")
            parameter.copy_(tensor)
    return (model.export() if isinstance(model, CompactSpeculator) else model).eval()


def _first_tied_name(name: str) -> str:
    """Where a tied stage's tensor sits when a file holds it once: stage 0's, or ``proj.1``."""
    kind, stage, rest = name.split(".", 2)
    first = "1" if kind == "proj" and int(stage) >= 1 else "0"
    return f"{kind}.{first}.{rest}"


def save_speculator(model: MLPSpeculator, directory: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``model`` in IBM's layout: ``config.json`` and ``model.safetensors`` with every stage's
    tensors (tied ones under each stage's name), cast to ``dtype``; a :class:`CompactSpeculator`
    as a compact checkpoint (module docstring), each tied tensor once."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    compact = isinstance(model, CompactSpeculator)
    spec = replace(model.full_spec, draft_vocab_size=len(model.token_map)) if compact else model.spec
    fields = {k: v for k, v in asdict(spec).items() if k != "draft_vocab_size" or v}
    config = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", **fields,
              "torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: p.detach().to(dtype).cpu().clone().contiguous()
               for name, p in model.named_parameters(remove_duplicate=compact)}  # compact: tied tensors once
    if compact:
        tensors["token_ids"] = model.token_map.to(torch.int64).cpu().contiguous()
    save_file(tensors, directory / "model.safetensors")
    return directory
