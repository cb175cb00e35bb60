"""The seam between the training spine and what it trains.

A task gives the spine a model, data, a loss and a metric; the spine (Hogwild workers, the
trainer, every sync mode) is the same for all of them. Two tasks ship: `ctr` (DLRM on CTR
rows, normalized entropy) and `digits` (scikit-learn's bundled 8x8 digits, a small CNN,
accuracy: the image-classification side of Sync-Switch, Li et al., ICDCS 2021,
arXiv 2104.08364).

Every task's data has the CTR row layout that `shadowsync.data.dataset.batches` reads:
`dense` features, `cats` (categorical ids for embedding tables; zero columns when a task has
none) and `labels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    import numpy as np

    from shadowsync.config import CheckpointConfig, DataConfig, ModelConfig
    from shadowsync.embeddings import EmbeddingClient


class TaskInputs(Protocol):
    """What a task reads of a run's options: which task, its data, its model, the seed its
    dense weights start from, and the checkpoint options (a --warm-start keeps its model's
    quantile buckets). The rest of the configuration (the sync, the cluster) is the spine's.
    A `TrainConfig` is one: a caller hands its configuration, the task sees these fields."""

    task: str
    seed: int
    data: DataConfig
    model: ModelConfig
    checkpoint: CheckpointConfig


@dataclass(frozen=True)
class Features:
    """The shape every part of a run is sized by (model, tables, sharding), read from the data."""

    num_dense: int
    table_rows: tuple[int, ...]  # rows of each table (dynamic tables: each one's row budget)
    raw_ids: bool = False  # dynamic tables: ids reach the tables unfolded
    multi_hot: tuple[bool, ...] = ()  # whether each table is a multi-hot feature's (): none

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def id_modulus(self) -> tuple[int, ...]:
        """What the data folds each table's ids by (0: not at all, for dynamic tables)."""
        return (0,) * len(self.table_rows) if self.raw_ids else self.table_rows


class Rows(Protocol):
    """A task's rows, in the layout `shadowsync.data.dataset.batches` reads (`CtrData`,
    `DigitsData`)."""

    skipped_lines: int  # lines of the source left out as malformed (--skip-bad-lines)

    def __len__(self) -> int:
        ...


class RunningMetric(Protocol):
    """The task's training metric over the most recent examples the workers reported."""

    name: str

    def add(self, examples: int, loss_sum: float, label_sum: float) -> None:
        ...

    @property
    def value(self) -> float:
        ...


@dataclass
class DataPlan:
    """Where training and evaluation rows come from, decided once per run."""

    train: Rows  # CtrData for ctr
    eval: Rows
    train_stop: int
    eval_start: int
    eval_stop: int
    teacher_eval_ne: float | None
    features: Features
    open_examples: int | None = None  # what workers pass to Task.open_data for the same rows
    open_path: str | None = None  # where workers open the rows (None: --data as given)
    # --epochs: rows of one pass; training then reads logical rows [0, train_stop) of
    # shuffled passes (`shadowsync.data.dataset.EpochOrder`). None: one pass, in order.
    epoch_rows: int | None = None
    # --val-share: validation rows [val_start, val_stop) of `train` (None: no validation)
    val_start: int | None = None
    val_stop: int | None = None

    @property
    def rows_per_epoch(self) -> int:
        return self.epoch_rows if self.epoch_rows is not None else self.train_stop

    @property
    def skipped_lines(self) -> int:
        extra = self.eval.skipped_lines if self.eval is not self.train else 0
        return self.train.skipped_lines + extra



class Task(Protocol):
    name: str
    metric: str  # the headline held-out metric, reported as eval_<metric>
    higher_is_better: bool
    output: str  # the saved model's last activation (`TrainedModel.output`)
    categorical: bool  # whether it has categorical features (embedding tables) to save

    def evaluation_data(self, trained_on: str, data: str) -> str | None:
        """`shadowsync eval --data data` of a model trained on --data `trained_on`: the --data
        whose held-out rows `plan_data` re-plans, or None to score every row of `data`."""
        ...

    def metrics_of(self, pred: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The held-out metrics of a saved model's predictions."""
        ...

    def features(self, cfg: TaskInputs) -> Features:
        """The shape the model and tables are sized by, cheaply (no data conversion)."""
        ...

    def build_model(self, cfg: TaskInputs, features: Features) -> torch.nn.Module:
        """The dense model, identical on every trainer (seeded by cfg.seed)."""
        ...

    def plan_data(self, cfg: TaskInputs) -> DataPlan:
        ...

    def open_data(self, path: str, examples: int | None, seed: int, skip_bad_lines: bool) -> Rows:
        """The same rows `plan_data` planned, opened again in a worker process."""
        ...

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        ...

    def running_metric(self) -> RunningMetric:
        ...

    def prepare_evaluation(self) -> None:
        """Import now what `evaluate` needs, where that takes seconds: a process with time to
        spare before training calls it, rather than pay for it in the first evaluation."""
        ...

    def evaluate(self, model: torch.nn.Module, tables: EmbeddingClient, plan: DataPlan, start: int,
                 stop: int) -> dict[str, float]:
        ...

    def summary(self, final: dict[str, float], plan: DataPlan) -> dict[str, object]:
        """Summary entries of the final evaluation."""
        ...
