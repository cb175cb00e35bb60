"""A dense model of your own for shadowsync: any nn.Module whose forward takes the dense
features [B, D] and the looked-up embeddings [B, T, E] and returns logits [B].

shadowsync calls the factory `mlp(num_dense, num_tables, embedding_dim)` in every process of
the job, so it lives at the top level of an importable module (this file), named on the
command line as `--model my_model:mlp`.
"""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, num_dense: int, num_tables: int, embedding_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_dense + num_tables * embedding_dim, 64),
                                 nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([dense, emb.flatten(1)], dim=1)).squeeze(1)


def mlp(num_dense: int, num_tables: int, embedding_dim: int) -> nn.Module:
    return MLP(num_dense, num_tables, embedding_dim)
