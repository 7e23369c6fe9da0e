"""PARD's training objective (AMD, arXiv 2504.18583): one forward teaches a draft every depth.

At inference a PARD draft is fed its new tokens followed by ``k - 1`` mask tokens, and the
logits at the last real token and at the masks give drafts 1 to ``k``. Training lays a
conversation of ``T`` tokens out in ``depths`` copies and runs them as one sequence:

- copy 0 is the conversation itself: query ``p`` predicts token ``p + 1`` from tokens
  ``0 .. p``, as an autoregressive draft learns (depth 1);
- in copy ``j`` every token is the mask token, and query ``p`` stands for the ``j``-th mask
  after real token ``p - j``: it sees copy 0's tokens ``0 .. p - j`` and the masks before it in
  its own run, which are copy ``i``'s queries at ``p - j + i`` (``0 < i < j``), and predicts
  token ``p + 1`` (depth ``j + 1``).

Every query keeps the position id ``p`` it has at inference. Conditional drop-token (COD): copy
``j`` keeps a random share ``keep ** j`` (at least ``keep_min``) of its queries, drawn among those
whose run exists in copy ``j - 1`` (query ``p - 1`` was kept there), so a sequence of
``depths x T`` tokens shrinks to about ``(1 + keep + keep^2 + ...) x T`` for the same depths.

A query is scored where its label is an assistant token (the batch's ``loss_mask``), which
also rules out padding. The mask token's input embedding is trained apart (``mask_embedding``):
the draft's embedding stays frozen and tied to its output layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from specdec.training import Scores, TrainingVocabulary, projection


@dataclass
class Layout:
    """The queries of a PARD sequence: each one's copy (its depth less one) and position."""

    copy: torch.Tensor
    position: torch.Tensor

    def visibility(self) -> torch.Tensor:
        """``[N, N]`` bool: which queries each query attends to."""
        cq, pq = self.copy[:, None], self.position[:, None]
        ck, pk = self.copy[None, :], self.position[None, :]
        real = (ck == 0) & (pk <= pq - cq)
        run = (ck > 0) & (ck <= cq) & (pk - ck == pq - cq)
        return real | run


def pard_layout(length: int, depths: int, keep: float = 1.0, keep_min: float = 0.0,
                generator: torch.Generator | None = None) -> Layout:
    """The queries of ``depths`` copies of a ``length``-token sequence, copy ``j > 0`` keeping a
    random ``max(keep ** j, keep_min)`` of ``length`` queries (COD; all at ``keep`` 1)."""
    copies, positions = [torch.zeros(length, dtype=torch.long)], [torch.arange(length)]
    previous = positions[0]
    for j in range(1, depths):
        candidates = previous[previous + 1 < length] + 1
        count = min(len(candidates), int(length * max(keep**j, keep_min)) if keep < 1 else len(candidates))
        if count == 0:
            break
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]].sort().values
        copies.append(torch.full((count,), j, dtype=torch.long))
        positions.append(chosen)
        previous = chosen
    return Layout(torch.cat(copies), torch.cat(positions))


class PardDraft(nn.Module):
    """A draft being turned into a PARD draft: the model and its mask token's input embedding."""

    def __init__(self, draft: nn.Module, mask_token: int) -> None:
        super().__init__()
        self.draft = draft
        self.mask_token = mask_token
        row = draft.get_input_embeddings().weight[mask_token].detach().float().clone()
        self.mask_embedding = nn.Parameter(row)

    def trainable(self) -> dict[str, torch.Tensor]:
        return {name: p for name, p in self.named_parameters() if p.requires_grad}

    def hidden(self, input_ids: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The final normed states ``[B, N, hidden]`` of the layout's queries over ``input_ids``."""
        device = input_ids.device
        copy, position = layout.copy.to(device), layout.position.to(device)
        embeds = self.draft.get_input_embeddings()(input_ids[:, position])
        is_mask = (copy > 0)[None, :, None]
        embeds = torch.where(is_mask, self.mask_embedding.to(embeds.dtype), embeds)
        visible = layout.visibility()
        bias = torch.zeros(visible.shape, dtype=embeds.dtype)
        bias.masked_fill_(~visible, torch.finfo(embeds.dtype).min)
        batch = input_ids.shape[0]
        out = self.draft.model(inputs_embeds=embeds, attention_mask=bias.to(device)[None, None].expand(batch, 1, -1, -1),
                               position_ids=position[None].expand(batch, -1), use_cache=False)
        return out.last_hidden_state


def pard_loss(module: PardDraft, input_ids: torch.Tensor, loss_mask: torch.Tensor, layout: Layout, depths: int,
              decay: float = 1.0, chunk: int = 1024, backward: bool = False, bf16: bool = False,
              vocabulary: TrainingVocabulary | None = None) -> Scores:
    """Per depth, the summed cross-entropy, top-1 hits and queries scored over a right-padded batch.

    :param loss_mask: ``[B, T]`` marks assistant tokens (False on padding): the labels scored.
    :param backward: back-propagate ``sum_j decay ** j * mean loss of depth j + 1`` (training).
    :param vocabulary: score over these tokens only (training): a label outside is not scored.
    """
    device = input_ids.device
    length = input_ids.shape[1]
    copy, position = layout.copy.to(device), layout.position.to(device)
    has_label = position + 1 < length
    label_at = torch.where(has_label, position + 1, 0)
    labels = input_ids[:, label_at]
    scored = loss_mask.to(device)[:, label_at] & has_label[None]
    depth = copy[None].expand_as(labels)
    if vocabulary is not None:
        index = vocabulary.index[labels]
        scored &= index >= 0
        labels = index
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = module.hidden(input_ids, layout)[scored]
    labels, depth = labels[scored], depth[scored]
    head = projection(module.draft.get_output_embeddings(), vocabulary)
    sums = torch.zeros(depths, device=device)
    hits = torch.zeros(depths, dtype=torch.long, device=device)
    counts = torch.bincount(depth, minlength=depths)[:depths]
    weights = torch.tensor([decay**j for j in range(depths)], device=device) / counts.clamp(min=1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(labels), chunk):
        part = slice(start, start + chunk)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = head(hidden[part]).float()
        losses = F.cross_entropy(logits, labels[part], reduction="none")
        sums.index_add_(0, depth[part], losses.detach())
        hits.index_add_(0, depth[part], (logits.argmax(-1) == labels[part]).long())
        if backward:
            total = total + (losses * weights[depth[part]]).sum()
    if backward and len(labels):
        total.backward()
    return Scores(sums.tolist(), hits.tolist(), counts.tolist())
