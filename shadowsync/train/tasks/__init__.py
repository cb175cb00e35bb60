"""Tasks the spine trains: one module each, one entry in `TASKS`; and what the rest of a run
asks of the task its configuration names (`features_of`, `plan_data`, `build_dense_model`)."""

from __future__ import annotations

import torch

from shadowsync.config import TrainConfig
from shadowsync.train.tasks.base import DataPlan, Features, Task, TaskInputs
from shadowsync.train.tasks.ctr import CtrTask
from shadowsync.train.tasks.digits import DigitsTask

TASKS: dict[str, Task] = {t.name: t for t in (CtrTask(), DigitsTask())}


def task_of(name: str) -> Task:
    return TASKS[name]


def features_of(cfg: TrainConfig) -> Features:
    """The shape the run's model and tables are sized by (the task's, from cheap headers)."""
    return task_of(cfg.task).features(TaskInputs.of(cfg))


def plan_data(cfg: TrainConfig) -> DataPlan:
    """Open (convert, generate) the task's data once and decide train and held-out rows."""
    return task_of(cfg.task).plan_data(TaskInputs.of(cfg))


def build_dense_model(cfg: TrainConfig, features: Features) -> torch.nn.Module:
    """The one place a run's dense model is made (the task's: DLRM or --model for ctr), in
    every process."""
    return task_of(cfg.task).build_model(TaskInputs.of(cfg), features)


__all__ = ["TASKS", "DataPlan", "Features", "Task", "TaskInputs", "build_dense_model",
           "features_of", "plan_data", "task_of"]
