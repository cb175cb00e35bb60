"""A trained model as one plain PyTorch module: the embedding tables and the dense model.

Training keeps the tables apart from the dense model (fused matrices in a trainer's shared
memory, or pieces on embedding servers). `TrainedModel` puts them back together as ordinary
torch modules, one `nn.EmbeddingBag` per categorical feature under the feature's name, so
the result can be scored, inspected, fine-tuned, saved with `torch.save` or exported with
`torch.export` without shadowsync.

Every feature is looked up as a bag: values, per-example offsets and the bag's pooling. A
Criteo-style feature has one id per example, so its bags hold one id each (offsets 0..B-1)
and pooling changes nothing; a multi-hot feature would pass its own values and offsets to
the same module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from shadowsync.embeddings.pooling import Bags

OUTPUTS = ("sigmoid", "softmax")  # a click probability per example, or class probabilities


class TrainedModel(nn.Module):
    """`forward(dense [B, num_dense], sparse [B, num_tables] int64) -> logits`; ids are taken
    modulo each table's rows, as training took them. `predict` gives probabilities."""

    def __init__(self, dense_model: nn.Module, tables: Mapping[str, torch.Tensor],
                 num_dense: int, output: str = "sigmoid") -> None:
        super().__init__()
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        self.dense_model = dense_model
        self.tables = nn.ModuleDict({
            name: nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode="sum")
            for name, weight in tables.items()})
        self.register_buffer("table_rows", torch.tensor([len(w) for w in tables.values()],
                                                        dtype=torch.long))
        self.num_dense = num_dense
        self.output = output
        self.eval()

    @property
    def feature_names(self) -> list[str]:
        return list(self.tables.keys())

    @property
    def table_width(self) -> int:
        """Columns of every table's rows (the embedding width, plus one with --id-bias)."""
        return next(iter(self.tables.values())).embedding_dim if len(self.tables) else 0

    def embed(self, sparse: torch.Tensor | Bags) -> torch.Tensor:
        """ids [B, num_tables], or `Bags` of multi-hot features -> the pooled vectors
        [B, num_tables, table_width]."""
        if isinstance(sparse, Bags):
            return self._embed_bags(sparse)
        batch = sparse.shape[0]
        if len(self.tables) == 0:
            return torch.zeros(batch, 0, 0)
        ids = sparse.remainder(self.table_rows)
        offsets = torch.arange(batch, dtype=torch.long, device=sparse.device)
        return torch.stack([bag(ids[:, i], offsets)
                            for i, bag in enumerate(self.tables.values())], dim=1)

    def _embed_bags(self, bags: Bags) -> torch.Tensor:
        rows = torch.empty(len(bags.ids), self.table_width)
        for t, bag in enumerate(self.tables.values()):
            lookups = (bags.tables == t).nonzero().squeeze(1)
            ids = bags.ids.index_select(0, lookups).remainder(int(self.table_rows[t]))
            rows.index_copy_(0, lookups, bag.weight.index_select(0, ids))
        return bags.pool(rows)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor | Bags | None = None
                ) -> torch.Tensor:
        if sparse is None:
            sparse = torch.zeros(dense.shape[0], 0, dtype=torch.long)
        return self.dense_model(dense, self.embed(sparse))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.output == "sigmoid" else torch.softmax(logits, 1)

    @torch.no_grad()
    def predict(self, dense: Any, sparse: Any = None, batch_size: int = 65_536) -> torch.Tensor:
        """Probabilities for rows of `dense` [n, num_dense] and `sparse` [n, num_tables]
        (tensors or arrays), `batch_size` rows at a time: [n] clicks, or [n, classes]."""
        x = torch.as_tensor(np.asarray(dense, dtype=np.float32))
        n = len(x)
        if isinstance(sparse, Bags):  # a batch of multi-hot features, scored whole
            if sparse.shape != (n, len(self.tables)):
                raise ValueError(f"sparse bags are {list(sparse.shape)}, expected "
                                 f"[{n}, {len(self.tables)}]")
            with torch.no_grad():
                return self.probabilities(self(x, sparse))
        ids = (torch.zeros(n, 0, dtype=torch.long) if sparse is None
               else torch.as_tensor(np.asarray(sparse, dtype=np.int64)))
        if x.dim() != 2 or x.shape[1] != self.num_dense:
            raise ValueError(f"dense must be [n, {self.num_dense}], got {list(x.shape)}")
        if ids.dim() != 2 or ids.shape != (n, len(self.tables)):
            raise ValueError(f"sparse must be [{n}, {len(self.tables)}], got {list(ids.shape)}")
        was_training = self.training
        self.eval()
        try:
            parts = [self.probabilities(self(x[i:i + batch_size], ids[i:i + batch_size]))
                     for i in range(0, n, batch_size)]
        finally:
            self.train(was_training)
        if parts:
            return torch.cat(parts)
        return torch.zeros((0,) if self.output == "sigmoid" else (0, 0))

    def schema(self) -> dict[str, Any]:
        """What the inputs are: the feature schema an exported model is shipped with."""
        return {"dense_width": self.num_dense,
                "features": [{"name": name, "rows": int(rows)} for name, rows
                             in zip(self.feature_names, self.table_rows.tolist(), strict=True)],
                "table_width": self.table_width, "output": self.output}
