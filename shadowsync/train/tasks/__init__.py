"""Tasks the spine trains: one module each, one entry in `TASKS`; and what the rest of a run
asks of the task its configuration names (`features_of`, `plan_data`, `build_dense_model`)."""

from __future__ import annotations

import torch

from shadowsync.train.tasks.base import DataPlan, Features, Task, TaskInputs
from shadowsync.train.tasks.ctr import CtrTask
from shadowsync.train.tasks.digits import DigitsTask

TASKS: dict[str, Task] = {t.name: t for t in (CtrTask(), DigitsTask())}


def task_of(name: str) -> Task:
    return TASKS[name]


def features_of(inputs: TaskInputs) -> Features:
    """The shape the run's model and tables are sized by (the task's, from cheap headers)."""
    return task_of(inputs.task).features(inputs)


def plan_data(inputs: TaskInputs) -> DataPlan:
    """Open (convert, generate) the task's data once and decide train and held-out rows."""
    return task_of(inputs.task).plan_data(inputs)


def build_dense_model(inputs: TaskInputs, features: Features) -> torch.nn.Module:
    """The one place a run's dense model is made (the task's: DLRM or --model for ctr), in
    every process."""
    return task_of(inputs.task).build_model(inputs, features)


__all__ = ["TASKS", "DataPlan", "Features", "Task", "TaskInputs", "build_dense_model",
           "features_of", "plan_data", "task_of"]
