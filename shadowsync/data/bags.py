"""Bags of ids pooled into one vector per (example, feature): multi-hot features.

A batch whose features all carry one id is a plain tensor ids [B, T], looked up as it always
was. When some features carry several ids per example (the genres of a movie, the last items a
user clicked), the batch is a `Bags`: every id to look up as a (table, id) pair, the slot
(example, feature) it is pooled into, and its factor there. With rows r_l and factors s_l,

    pooled[b, f] = sum_{l in bag(b, f)} s_l * r_l,        s_l = w_l          (sum)
                                                           s_l = w_l / |bag|  (mean)

(w_l = 1 when the feature is not weighted; an empty bag pools to zero). Single-id features
are bags of one with s = 1, so a holder sees one kind of lookup. The pooled vectors are
linear in the rows, so the gradient reaching row r_l from slot (b, f) is

    d loss / d r_l = s_l * d loss / d pooled[b, f],

and an id met several times in a batch (in one bag or many) gets the sum of those terms:
the holders' sparse updates already sum repeated rows before row-wise Adagrad takes its step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

POOLINGS = ("sum", "mean")


@dataclass(frozen=True)
class Bags:
    """The sparse input of a batch with multi-hot features (see the module's equations).

    Lookups are listed by slot (example by example, feature by feature, a bag's ids in their
    order), so that a slot's lookups are one run and pooling is one fused EmbeddingBag sum
    (4x faster here than a gather and a scatter-add). `scale` is None when every factor is 1.
    """

    tables: torch.Tensor  # [L] int64: the table of each lookup
    ids: torch.Tensor  # [L] int64: the id within that table
    slot: torch.Tensor  # [L] int64: b * features + f, the pooled vector it adds to (sorted)
    scale: torch.Tensor | None  # [L] float32: s_l, or None for all ones
    shape: tuple[int, int]  # (B, features): what the pooled vectors are, less their width
    starts: torch.Tensor  # [B * features] int64: where each slot's run of lookups starts

    @classmethod
    def build(cls, single: torch.Tensor,
              multi: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]]) -> Bags:
        """From ids [B, T] of the single-id features and, per multi-hot feature, (values,
        offsets [B + 1], weights or None, pooling); the multi-hot features are tables T, T + 1..."""
        b, t = single.shape
        features = t + len(multi)
        examples = torch.arange(b)
        tables = [torch.arange(t).repeat(b)]
        ids = [single.reshape(-1)]
        slot = [(examples.unsqueeze(1) * features + torch.arange(t)).reshape(-1)]
        scales: list[torch.Tensor | None] = [None]
        for m, (values, offsets, weights, pooling) in enumerate(multi):
            if pooling not in POOLINGS:
                raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
            lengths = offsets[1:] - offsets[:-1]
            example = torch.repeat_interleave(examples, lengths)
            tables.append(torch.full((len(values),), t + m, dtype=torch.int64))
            ids.append(values)
            slot.append(example * features + t + m)
            scale = weights
            if pooling == "mean":
                inv = 1.0 / lengths.clamp(min=1).to(torch.float32)
                per_id = inv.index_select(0, example)
                scale = per_id if scale is None else scale * per_id
            scales.append(scale)
        all_slots = torch.cat(slot)
        order = torch.argsort(all_slots, stable=True)
        scale = None
        if any(s is not None for s in scales):
            scale = torch.cat([torch.ones(len(i)) if s is None else s.to(torch.float32)
                               for i, s in zip(ids, scales)]).index_select(0, order)
        counts = torch.bincount(all_slots, minlength=b * features)
        starts = torch.zeros(b * features, dtype=torch.int64)
        torch.cumsum(counts[:-1], 0, out=starts[1:])
        return cls(torch.cat(tables).index_select(0, order), torch.cat(ids).index_select(0, order),
                   all_slots.index_select(0, order), scale, (b, features), starts)

    def __len__(self) -> int:
        return self.shape[0]

    def pool(self, source: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled vectors [B, features, d] of the lookups' rows: ``source[index[l]]`` for
        lookup l (``source`` itself, [L, d], without ``index``)."""
        if index is None:
            index = torch.arange(len(self.ids))
        out = F.embedding_bag(index, source, self.starts, mode="sum",
                              per_sample_weights=self.scale)
        return out.view(*self.shape, source.shape[1])

    def unpool(self, grads: torch.Tensor) -> torch.Tensor:
        """d loss / d pooled [B, features, d] -> d loss / d row for each lookup [L, d] (repeats
        not yet summed)."""
        per_lookup = grads.reshape(-1, grads.shape[-1]).index_select(0, self.slot)
        return per_lookup if self.scale is None else per_lookup.mul_(self.scale.unsqueeze(1))
