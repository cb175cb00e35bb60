"""DLRM (Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", 2019), split at the embedding lookup.

The embedding tables are model-parallel (held by a trainer or by embedding parameter servers
and updated sparsely), while everything here is dense and replicated, so it is the part that
synchronization rules average. `DLRMDense` takes the pooled embedding vectors as an input
tensor; the caller looks them up, and reads their gradient back after `backward()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class ModelConfig:
    """Sizes of the DLRM: the feature counts come from the data, the widths default to what
    two CPU cores train quickly."""

    num_dense: int
    num_sparse: int
    embedding_dim: int = 16
    bottom_mlp: list[int] = field(default_factory=lambda: [64])
    top_mlp: list[int] = field(default_factory=lambda: [128, 64])


def _mlp(sizes: list[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if final_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRMDense(nn.Module):
    """Bottom MLP over dense features, dot interaction with the embeddings, top MLP to a logit."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.embedding_dim
        self.bottom = _mlp([cfg.num_dense, *cfg.bottom_mlp, d], final_activation=True)
        n = cfg.num_sparse + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        # The pairs as positions in the flattened n x n products: index_select's backward is
        # one index_add, where indexing by (rows, cols) scatters with an accumulating
        # index_put; the same values, and a dense step about a fifth faster on one core.
        self.register_buffer("_pairs", rows * n + cols, persistent=False)
        self.top = _mlp([d + n * (n - 1) // 2, *cfg.top_mlp, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """dense [B, num_dense], embedded [B, num_sparse, dim] -> logits [B]."""
        x = self.bottom(dense)
        feats = torch.cat([x.unsqueeze(1), embedded], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2)).flatten(1).index_select(1, self._pairs)
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)
