"""Every `--task`, named in one table the configuration reads (its choices, its help, and
what a task allows of the other options) without importing the tasks themselves, which
need torch. Each name here is one entry of `shadowsync.train.tasks.TASKS` (the task's
module: data, model, metric); tests/test_modes.py checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskKind:
    name: str
    help: str
    validates: bool  # --val-share can hold training rows out to validate on


TASK_KINDS: dict[str, TaskKind] = {t.name: t for t in [
    TaskKind("ctr", "DLRM on CTR rows, NE", validates=True),
    TaskKind("digits", "scikit-learn's 8x8 digits, a small CNN, accuracy", validates=False),
]}

TASK_CHOICES = tuple(TASK_KINDS)
DEFAULT_TASK = "ctr"
TASK_HELP = "what to train: " + "; ".join(f"{t.name} ({t.help})" for t in TASK_KINDS.values())
