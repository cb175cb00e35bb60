"""`shadowsync eval`: a checkpoint's model scored on any data (the held-out rows of the
built-in data, or every row of a file or directory), with the same metrics as training.

The model comes back whole through `train.saved_model.load_model` (docs/model-export.md says
where each part of it is in a checkpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from shadowsync.checkpoint.store import read_manifest
from shadowsync.data.buckets import cut_like
from shadowsync.data.dataset import check_ids, layout, open_data, resolve, sparse_layout
from shadowsync.errors import UserError
from shadowsync.metrics import worse_than_constant
from shadowsync.models.trained import TrainedModel
from shadowsync.train.saved_model import load_model, score
from shadowsync.train.tasks import plan_data, task_of


def _trained_layout(path: str, schema: str | None) -> str | None:
    """How the training data's ids were pooled, when those data are still there to say."""
    try:
        return sparse_layout(resolve(path, schema)) if Path(path).is_dir() else None
    except (UserError, OSError):
        return None


def _model_layout(trained: TrainedModel) -> str:
    """`CtrData.sparse_layout` of the data the model was trained on, from its features."""
    return layout(trained.num_single, [(f.name, f.weighted, f.pooling)
                                       for f in trained.multi_hot])


def evaluate_checkpoint(path: str, data: str, predictions: str | None = None,
                        skip_bad_lines: bool = False,
                        model: Callable[..., object] | str | None = None) -> dict[str, object]:
    """Metrics of the checkpoint at `path` (a run directory: its newest) on `data`: every
    row of a file or directory, or the held-out rows of the built-in data."""
    if predictions is not None:
        parent = Path(predictions).resolve().parent
        if not parent.is_dir():
            raise UserError(f"--predictions {predictions}: no directory {parent}")
    cfg, trained, step = load_model(path, model)
    task = task_of(cfg.task)
    planned = task.evaluation_data(cfg.data.path, data)
    if planned is not None:
        plan = plan_data(replace(cfg, eval_data=None, data=planned))
        rows, start, stop = plan.eval, plan.eval_start, plan.eval_stop
    else:
        # numbers cut into the model's quantile buckets at its edges (`data.buckets`)
        path = cut_like(resolve(data, cfg.data.schema), [asdict(f) for f in trained.features])
        rows = open_data(path, skip_bad_lines=skip_bad_lines)
        start, stop = 0, len(rows)
        takes = (trained.num_dense, len(trained.tables))
        if (rows.num_dense, rows.num_tables) != takes:
            raise UserError(f"--data {data}: {rows.num_dense} dense and {rows.num_tables} "
                            f"categorical features, but the checkpoint's model takes "
                            f"{takes[0]} and {takes[1]}")
        trained_on = (_model_layout(trained) if "sparse_features" in read_manifest(step)
                      else _trained_layout(cfg.data.path, cfg.data.schema))
        if trained_on is not None and rows.sparse_layout() != trained_on:
            raise UserError(f"--data {data}: sparse features {rows.sparse_layout()}, but the "
                            f"checkpoint's model was trained on {trained_on}")
        if not trained.raw_ids:
            check_ids(rows, tuple(trained.table_rows.tolist()))
    pred, y = score(trained, rows, start, stop)
    result: dict[str, object] = dict(task.metrics_of(pred, y))
    warning = worse_than_constant(result.get("ne"), f"--data {data}:")
    if warning:
        logging.getLogger(__name__).warning("%s", warning)
    result.update({"examples": stop - start, "checkpoint": str(step)})
    if predictions is not None:
        np.save(predictions, pred)
        result["predictions"] = predictions
    return result
