"""Tasks the spine trains: one module each, one entry in `TASKS`."""

from __future__ import annotations

from shadowsync.train.tasks.base import DataPlan, Features, Task
from shadowsync.train.tasks.ctr import CtrTask
from shadowsync.train.tasks.digits import DigitsTask

TASKS: dict[str, Task] = {"ctr": CtrTask(), "digits": DigitsTask()}


def task_of(name: str) -> Task:
    return TASKS[name]


__all__ = ["TASKS", "DataPlan", "Features", "Task", "task_of"]
