"""An MLP speculator trained over a draft vocabulary (``--train-vocab``), exported in IBM's layout.

A stage's embedding and output layer are ``vocab x inner`` each: for SmolLM2 two 49,152-row
matrices, which dwarf the rest of the speculator. Trained over the 8,192 tokens it will draft
over, the speculator holds only their rows: each output layer the vocabulary's rows, each
embedding those rows plus one that every other token shares (stage 0 reads the last committed
token, which can be any). The optimizer then steps a sixth of the weights it would, and the
export is mostly repeated rows, which compress to almost nothing in git.

:meth:`CompactSpeculator.export` writes the full layout vLLM loads: every embedding row outside
the vocabulary is the shared one, and every output row outside it is zero. Drafting with a draft
vocabulary of those tokens (the shipped ranking for the shipped speculator) never scores the zero
rows; drafting over the whole vocabulary scores them 0.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from specdec_mlp_speculator.speculator import MLPSpeculator, SpeculatorSpec


class CompactSpeculator(MLPSpeculator):
    """An MLP speculator of ``spec`` whose output layers hold the rows of target ids ``ids`` only
    (``token_map``) and whose embeddings hold theirs and one shared row for every other id."""

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
        """The same speculator over the whole vocabulary, in IBM's layout (module docstring)."""
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
