"""Held-out evaluation of the dense model plus embedding lookups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from shadowsync.data.dataset import CtrData, batches
from shadowsync.metrics import evaluate_predictions


@torch.no_grad()
def predict(model: torch.nn.Module, tables: Any, data: CtrData, start: int, stop: int,
            table_size: Sequence[int], batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    preds, labels = [], []
    for dense, ids, y in batches(data, start, stop, batch_size, table_size=table_size):
        preds.append(torch.sigmoid(model(dense, tables.lookup(ids))).numpy())
        labels.append(y.numpy())
    return np.concatenate(preds), np.concatenate(labels)


def evaluate(model: torch.nn.Module, tables: Any, data: CtrData, start: int, stop: int,
             table_size: Sequence[int]) -> dict[str, float]:
    pred, y = predict(model, tables, data, start, stop, table_size)
    return evaluate_predictions(pred, y)
