"""Held-out evaluation of the dense model plus embedding lookups."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from shadowsync.data.dataset import CtrData, predict_rows
from shadowsync.embeddings import EmbeddingClient
from shadowsync.metrics import evaluate_predictions


def predict(model: torch.nn.Module, tables: EmbeddingClient, data: CtrData, start: int, stop: int,
            table_size: Sequence[int], batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    return predict_rows(data, start, stop, table_size,
                        lambda dense, ids: torch.sigmoid(model(dense, tables.lookup(ids))),
                        batch_size)


def evaluate(model: torch.nn.Module, tables: EmbeddingClient, data: CtrData, start: int, stop: int,
             table_size: Sequence[int]) -> dict[str, float]:
    pred, y = predict(model, tables, data, start, stop, table_size)
    return evaluate_predictions(pred, y)
