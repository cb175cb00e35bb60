"""A plain single-process PyTorch DeepFM: the careful baseline of `bench realdata`.

DeepFM (Guo et al., IJCAI 2017): one embedding per field shared by a factorization machine
(first-order weights plus pairwise dot products of the field embeddings) and an MLP over the
concatenated embeddings; their logits add. Fields: each single-id column, each multi-hot
column (its ids' embeddings pooled by sum or mean, weighted if the data has weights), and
each dense feature (its value times a learned vector, as the paper does for numbers).

Trained with Adam on shuffled minibatches, one process, no synchronization; after each epoch
it scores the validation tail (the same rows `--val-share` holds out of the training data)
and keeps the epoch with the lowest validation log loss, stopping after `patience` epochs
without improvement. What it reports is that best epoch's model on the eval rows, with that
epoch's validation AUC (what `bench realdata` picks a setting of its grid by).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shadowsync.metrics import evaluate_predictions


@dataclass
class Rows:
    """Rows of an array directory, multi-hot features included, as tensors."""

    labels: torch.Tensor  # [n] float
    dense: torch.Tensor  # [n, D]
    cats: torch.Tensor  # [n, T] int64
    bags: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]  # values, offsets, weights
    table_sizes: list[int]  # single-id tables, then multi-hot
    poolings: list[str]
    bucketized: tuple[int, ...] = ()  # single-id columns cut from a dense feature's number

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, idx: np.ndarray) -> Rows:
        """The rows `idx` (multi-hot bags re-cut to them)."""
        t = torch.from_numpy(idx)
        bags = []
        for values, offsets, weights in self.bags:
            starts, ends = offsets[t], offsets[t + 1]
            lengths = ends - starts
            pos = torch.repeat_interleave(starts, lengths) + (
                torch.arange(int(lengths.sum())) -
                torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths))
            new_offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
            bags.append((values[pos], new_offsets, None if weights is None else weights[pos]))
        return Rows(self.labels[t], self.dense[t], self.cats[t], bags, self.table_sizes,
                    self.poolings, self.bucketized)


def load_rows(path: str) -> Rows:
    """An array directory (as `shadowsync.data.tabular` writes it) into memory."""
    from shadowsync.data import arrays

    p = Path(path)
    labels = torch.from_numpy(np.load(p / "labels.npy").astype(np.float32))
    dense = torch.from_numpy(np.load(p / "dense.npy").astype(np.float32))
    cats = torch.from_numpy(np.load(p / "cats.npy").astype(np.int64))
    doc = json.loads((p / arrays.FEATURES).read_text())
    sizes = [int(c["table_size"]) for c in doc["categorical"]]
    bucketized = tuple(j for j, c in enumerate(doc["categorical"]) if c.get("bucketize"))
    bags, poolings = [], []
    for m in doc.get("multi_hot", []):
        values, offsets, weights = arrays.check_multi_hot(str(p), m["name"],
                                                          int(m["table_size"]), len(labels))
        # copies: the files are mapped read-only, and torch wants tensors it may write
        bags.append((torch.from_numpy(np.array(values, np.int64)),
                     torch.from_numpy(np.array(offsets, np.int64)),
                     None if weights is None else torch.from_numpy(np.array(weights))))
        sizes.append(int(m["table_size"]))
        poolings.append(m["pooling"])
    return Rows(labels, dense, cats, bags, sizes, poolings, bucketized)


def split_rows(train_dir: str, eval_dir: str, val_share: float) -> tuple[Rows, Rows, Rows, Rows]:
    """(all training rows, their first 1 - val_share, the validation tail, the eval rows):
    the split every baseline of `bench realdata` trains, selects and reports on."""
    rows = load_rows(train_dir)
    n = len(rows)
    n_val = int(round(n * val_share))
    train, val = rows.take(np.arange(n - n_val)), rows.take(np.arange(n - n_val, n))
    return rows, train, val, load_rows(eval_dir)


class DeepFM(nn.Module):
    def __init__(self, num_dense: int, table_sizes: list[int], poolings: list[str], dim: int,
                 hidden: list[int], dropout: float, num_single: int) -> None:
        super().__init__()
        self.num_single = num_single
        self.emb = nn.ModuleList(
            [nn.Embedding(n, dim) for n in table_sizes[:num_single]]
            + [nn.EmbeddingBag(n, dim, mode=p) for n, p in
               zip(table_sizes[num_single:], poolings, strict=True)])
        self.first = nn.ModuleList(
            [nn.Embedding(n, 1) for n in table_sizes[:num_single]]
            + [nn.EmbeddingBag(n, 1, mode=p) for n, p in
               zip(table_sizes[num_single:], poolings, strict=True)])
        for e in [*self.emb, *self.first]:
            nn.init.normal_(e.weight, std=0.01)
        self.dense_vectors = nn.Parameter(torch.randn(num_dense, dim) * 0.01)
        self.dense_linear = nn.Linear(num_dense, 1) if num_dense else None
        fields = len(table_sizes) + num_dense
        layers: list[nn.Module] = []
        width = fields * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, rows: Rows) -> torch.Tensor:
        vecs, firsts = [], []
        for t in range(self.num_single):
            vecs.append(self.emb[t](rows.cats[:, t]))
            firsts.append(self.first[t](rows.cats[:, t]))
        for k, (values, offsets, weights) in enumerate(rows.bags):
            e, f = self.emb[self.num_single + k], self.first[self.num_single + k]
            vecs.append(e(values, offsets[:-1], per_sample_weights=weights))
            firsts.append(f(values, offsets[:-1], per_sample_weights=weights))
        if rows.dense.shape[1]:
            vecs += list((rows.dense.unsqueeze(2) * self.dense_vectors).unbind(1))
        v = torch.stack(vecs, 1)  # [B, fields, dim]
        first = torch.cat(firsts, 1).sum(1)
        if self.dense_linear is not None:
            first = first + self.dense_linear(rows.dense).squeeze(1)
        second = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)
        return first + second + self.mlp(v.flatten(1)).squeeze(1)


@dataclass
class DeepFMConfig:
    dim: int = 16
    hidden: tuple[int, ...] = (128, 64)
    dropout: float = 0.2
    lr: float = 1e-3
    batch_size: int = 256
    max_epochs: int = 12
    patience: int = 2
    weight_decay: float = 1e-6


@torch.no_grad()
def predict(model: DeepFM, rows: Rows, batch: int = 8192) -> np.ndarray:
    model.eval()
    out = [torch.sigmoid(model(rows.take(np.arange(lo, min(lo + batch, len(rows))))))
           for lo in range(0, len(rows), batch)]
    return torch.cat(out).numpy()


def train_deepfm(train_dir: str, eval_dir: str, val_share: float, seed: int,
                 cfg: DeepFMConfig | None = None, threads: int = 1) -> dict[str, Any]:
    """Train on the first 1 - val_share of the training rows, select the epoch on the rest,
    report that epoch's model on `eval_dir`."""
    cfg = cfg or DeepFMConfig()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    rows, train, val, test = split_rows(train_dir, eval_dir, val_share)
    model = DeepFM(rows.dense.shape[1], rows.table_sizes, rows.poolings, cfg.dim,
                   list(cfg.hidden), cfg.dropout, rows.cats.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(seed)
    best, best_epoch, best_state, since = float("inf"), 0, None, 0
    history = []
    started = time.perf_counter()
    for epoch in range(1, cfg.max_epochs + 1):
        model.train()
        order = rng.permutation(len(train))
        for lo in range(0, len(order), cfg.batch_size):
            b = train.take(order[lo:lo + cfg.batch_size])
            loss = F.binary_cross_entropy_with_logits(model(b), b.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        m = evaluate_predictions(predict(model, val), val.labels.numpy())
        history.append({"epoch": epoch, "val_logloss": m["logloss"], "val_auc": m["auc"],
                        "train_s": time.perf_counter() - started})
        if m["logloss"] < best:
            best, best_epoch, since = m["logloss"], epoch, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            since += 1
            if since >= cfg.patience:
                break
    assert best_state is not None
    model.load_state_dict(best_state)
    final = evaluate_predictions(predict(model, test), test.labels.numpy())
    return {"eval_auc": final["auc"], "eval_ne": final["ne"], "eval_logloss": final["logloss"],
            "val_auc": history[best_epoch - 1]["val_auc"], "best_epoch": best_epoch,
            "epochs_run": len(history), "history": history,
            "wall_s": time.perf_counter() - t0}
