"""The `ctr` task: DLRM (Naumov et al. 2019) on Criteo-format rows, normalized entropy.

The dense model is built by `build_dense_model(cfg)`, the one place to change for another
dense architecture on CTR rows.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from shadowsync.checkpoint.store import find_checkpoint, read_manifest
from shadowsync.data.arrays import is_array_dir
from shadowsync.data.buckets import cut_like, quantile_buckets, row_count
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.dataset import (
    DEFAULT_TABLE_SIZE,
    check_ids,
    feature_counts,
    is_generated,
    open_data,
    resolve,
    sparse_features,
    table_rows_of,
)
from shadowsync.embeddings import EmbeddingClient
from shadowsync.errors import UserError
from shadowsync.metrics import RunningNE, evaluate_predictions
from shadowsync.metrics.ctr import roc_auc
from shadowsync.models import build_model
from shadowsync.train.evaluate import evaluate
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks.base import DataPlan, Features, TaskInputs

DEFAULT_SYNTHETIC_EXAMPLES = 1_500_000


def _sizes_given(cfg: TaskInputs) -> tuple[list[int] | None, str]:
    """--table-size where it is not the default, and the file that declares the data's own
    sizes if it does (checked against them by `table_rows_of`)."""
    given = None if cfg.model.table_size == [DEFAULT_TABLE_SIZE] else cfg.model.table_size
    return given, cfg.data.schema or cfg.data.path


def _features(cfg: TaskInputs, path: str, num_dense: int, num_tables: int) -> Features:
    kind = table_builder(cfg.model)  # how --tables turns ids into rows
    return Features(num_dense, kind.table_rows(table_rows_of(
                        path, num_tables, cfg.model.table_rows, *_sizes_given(cfg))),
                    raw_ids=kind.raw_ids,
                    multi_hot=tuple(bool(f["multi_hot"])
                                    for f in sparse_features(path, num_tables)))


def features_of(cfg: TaskInputs) -> Features:
    """From the data's headers only: cheap in every process (a conversion, and the quantile
    buckets' cut, are made once and then found in the cache)."""
    path = rows_path(cfg)
    return _features(cfg, path, *feature_counts(path))


def rows_path(cfg: TaskInputs) -> str:
    """Where the training rows are read: --data, converted where it is Parquet or CSV, and
    for an array directory with --buckets (left open: on with --val-share) each dense
    column's quantile-bucket feature added, its edges from the rows the model fits on alone
    (`shadowsync.data.buckets`); a --warm-start keeps its model's buckets and their edges.
    Generated and Criteo rows are read as they are."""
    path = resolve(cfg.data.path, cfg.data.schema)
    buckets = cfg.data.quantile_buckets()
    if not buckets or not is_array_dir(path):
        return path
    if cfg.checkpoint.warm_start:
        step = find_checkpoint(cfg.checkpoint.warm_start, "--warm-start")
        return cut_like(path, read_manifest(step, "--warm-start").get("sparse_features", []))
    fit, _ = _training_rows(cfg, row_count(path), generated=False)
    return quantile_buckets(path, fit, buckets, cfg.data.no_buckets)


def _training_rows(cfg: TaskInputs, rows: int, generated: bool) -> tuple[int, int | None]:
    """(rows [0, fit) the model fits on in one pass, rows [fit, val_stop) it validates on
    (None: no --val-share)) of the `rows` of --data: all but the last tenth where there is
    no --eval-data, the first --examples of a file, less the --val-share tail."""
    stop = rows if cfg.data.eval_data else rows - rows // 10
    if stop == rows and not cfg.data.eval_data:
        raise UserError(f"{cfg.data.path}: too few examples ({rows}) to hold 10% out; "
                        "pass --eval-data")
    if cfg.data.examples and not generated:
        if cfg.data.examples > stop:
            raise UserError(f"--examples {cfg.data.examples}: {cfg.data.path} holds {stop:,} "
                            "training rows; to train on them more than once, use --epochs")
        stop = cfg.data.examples
    if cfg.data.val_share <= 0:
        return stop, None
    held = int(round(stop * cfg.data.val_share))
    if held < 1 or held >= stop:
        raise UserError(f"--val-share {cfg.data.val_share}: {held} of {stop:,} training "
                        "rows would validate; choose a share that leaves both some rows")
    return stop - held, stop


def plan_data(cfg: TaskInputs) -> DataPlan:
    generated = is_generated(cfg.data.path, cfg.data.schema)
    if generated:
        n_train = cfg.data.examples or DEFAULT_SYNTHETIC_EXAMPLES
        total = n_train + n_train // 9  # the last 10% of the generated rows are held out
        train = open_data(cfg.data.path, examples=total, seed=cfg.seed)
    else:
        train = open_data(rows_path(cfg), skip_bad_lines=cfg.data.skip_bad_lines)
    train_stop, val_stop = _training_rows(cfg, len(train), generated)
    if cfg.data.eval_data:
        # cut as the training rows are: at their quantile buckets' edges
        ev = open_data(cut_like(resolve(cfg.data.eval_data, cfg.data.schema),
                                sparse_features(train.source, train.num_tables)),
                       skip_bad_lines=cfg.data.skip_bad_lines)
        if (ev.num_dense, ev.num_tables) != (train.num_dense, train.num_tables):
            raise UserError(f"--eval-data {cfg.data.eval_data}: {ev.num_dense} dense and "
                            f"{ev.num_tables} categorical features, but --data has "
                            f"{train.num_dense} and {train.num_tables}")
        if ev.sparse_layout() != train.sparse_layout():
            raise UserError(f"--eval-data {cfg.data.eval_data}: sparse features "
                            f"{ev.sparse_layout()}, but --data has {train.sparse_layout()}")
        eval_start, eval_stop = 0, len(ev)
    else:
        ev = train
        eval_start, eval_stop = len(train) - len(train) // 10, len(train)
    val_start = None if val_stop is None else train_stop
    epoch_rows = train_stop if cfg.data.epochs > 1 else None
    train_stop *= cfg.data.epochs
    teacher = ev.teacher_ne(eval_start, eval_stop)
    if teacher is None:
        teacher = ev.teacher_ne_hint
    features = _features(cfg, train.source, train.num_dense, train.num_tables)
    for rows in (train, ev):
        if not features.raw_ids:
            check_ids(rows, features.table_rows)
    return DataPlan(train, ev, train_stop, eval_start, eval_stop, teacher, features,
                    open_examples=len(train) if generated else None,
                    open_path=None if generated else train.source,
                    epoch_rows=epoch_rows, val_start=val_start, val_stop=val_stop)


def build_dense_model(cfg: TaskInputs, features: Features) -> torch.nn.Module:
    """The one place a run's dense model is made (DLRM or --model), in every process."""
    # Every trainer starts from the same dense weights, as data-parallel training expects.
    torch.manual_seed(cfg.seed)
    # validating: a config that no job resolved (a test's, a peer's) builds what a job would
    return build_model(cfg.model, features.num_dense, features.num_tables,
                       validating=cfg.data.val_share > 0)


class CtrTask:
    name = "ctr"
    metric = "ne"
    higher_is_better = False
    output = "sigmoid"
    categorical = True

    def evaluation_data(self, trained_on: str, data: str) -> str | None:
        """Generated rows are scored on their held-out tenth; a file on every row."""
        return data if is_generated(data) else None

    def metrics_of(self, pred: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        return evaluate_predictions(pred, labels)

    def features(self, cfg: TaskInputs) -> Features:
        return features_of(cfg)

    def build_model(self, cfg: TaskInputs, features: Features) -> torch.nn.Module:
        return build_dense_model(cfg, features)

    def plan_data(self, cfg: TaskInputs) -> DataPlan:
        return plan_data(cfg)

    def open_data(self, path: str, examples: int | None, seed: int,
                  skip_bad_lines: bool) -> CtrData:
        return open_data(path, skip_bad_lines=skip_bad_lines, examples=examples, seed=seed)

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")

    def running_metric(self) -> RunningNE:
        return RunningNE()

    def prepare_evaluation(self) -> None:
        roc_auc()

    def evaluate(self, model: torch.nn.Module, tables: EmbeddingClient, plan: DataPlan, start: int,
                 stop: int) -> dict[str, float]:
        return evaluate(model, tables, plan.eval, start, stop, plan.features.id_modulus)

    def summary(self, final: dict[str, float], plan: DataPlan) -> dict[str, object]:
        teacher = plan.teacher_eval_ne
        return {"eval_ne": final["ne"], "eval_auc": final["auc"],
                "eval_logloss": final["logloss"], "calibration": final["calibration"],
                "eval_examples": final["examples"], "teacher_eval_ne": teacher,
                "ne_vs_teacher": final["ne"] / teacher if teacher else None}
