"""What a run leaves behind: metrics.jsonl, summary.json, a plot, and a table on stdout."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from shadowsync.train.progress import TrainerStats
    from shadowsync.train.tasks import DataPlan


class MetricsLog:
    """Appends one JSON object per line and flushes, so a crash keeps every line written.

    With `tensorboard`, the same rows also become TensorBoard scalars under
    `tensorboard/` beside the file, one per numeric field, stepped by examples seen.
    """

    def __init__(self, path: Path, tensorboard: bool = False) -> None:
        self.path = path
        self._fh: TextIO = open(path, "a", encoding="utf-8")
        self.rows: list[dict[str, object]] = []
        self._board = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._board = SummaryWriter(str(path.parent / "tensorboard"))

    def write(self, row: dict[str, object]) -> None:
        self.rows.append(row)
        self._fh.write(json.dumps(_finite(row)) + "\n")
        self._fh.flush()
        if self._board is not None:
            step = int(row.get("examples", len(self.rows)))
            for key, value in row.items():
                if key not in ("trainer", "examples") and _num(value):
                    self._board.add_scalar(key, value, step)

    def close(self) -> None:
        self._fh.close()
        if self._board is not None:
            self._board.close()


def summarize(record: dict[str, object], plan: DataPlan, stats: list[TrainerStats],
              final: dict[str, float], train_metric: float, wall_s: float) -> dict[str, object]:
    """The contents of summary.json: totals over trainers, the final evaluation, settings.
    `record`: the run's options as it records them (`TrainConfig.to_dict`, by flat name);
    `train_metric` is the task's running training metric (NE for ctr, loss for digits)."""
    from shadowsync.train.tasks import task_of

    task = task_of(str(record["task"]))
    examples = sum(s.examples for s in stats)
    return {
        "examples": examples,
        # The job's training time, from its processes meeting to the trainers' last step:
        # start-up, data preparation, the final checkpoint and evaluation are not in it (the
        # launcher adds total_s, the whole run).
        "wall_s": round(wall_s, 3),
        "eps": examples / wall_s if wall_s > 0 else 0.0,
        "train_eps": sum(s.train_eps for s in stats),
        # first step of any worker to last step of any worker: training without start-up
        "train_s": max(s.train_end for s in stats) - min(s.train_start for s in stats),
        "eps_per_trainer": [s.train_eps for s in stats],
        # CPU seconds the Hogwild workers spent training, whatever else the machine ran
        "train_cpu_s": round(sum(s.cpu_s for s in stats), 3),
        f"train_{task.running_metric().name}": train_metric,
        **task.summary(final, plan),
        "task": record["task"],
        "workers": record["workers"],
        "trainers": record["trainers"],
        "sync": record["sync"],
        "skipped_lines": plan.skipped_lines,
        "config": dict(record),
    }


def _finite(obj: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def write_summary(out: Path, summary: dict[str, object]) -> Path:
    path = out / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(summary), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def plot_ne(out: Path, rows: list[dict[str, object]], teacher_ne: float | None,
            xlabel: str = "training examples") -> Path | None:
    """Train (running window) and eval NE against examples seen; None (and no file) until
    either has two points, a curve (a run shorter than --log-every has one line of metrics:
    drawing its one point took a second of importing and rendering)."""
    train = [(r["examples"], r["train_ne"]) for r in rows if _num(r.get("train_ne"))]
    evals = [(r["examples"], r["eval_ne"]) for r in rows if _num(r.get("eval_ne"))]
    held_out = "eval NE (held-out sample)"
    validation = [(r["examples"], r["val_ne"]) for r in rows if _num(r.get("val_ne"))]
    if validation:  # --val-share: the validation tail is what training watched
        evals, held_out = validation, "validation NE (tail of the training data)"
    if len(train) < 2 and len(evals) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if train:
        ax.plot(*zip(*train), label="train NE (running window)", color="tab:blue")
    if evals:
        ax.plot(*zip(*evals), "o-", label=held_out, color="tab:orange")
    if teacher_ne:
        ax.axhline(teacher_ne, ls="--", color="gray", label=f"teacher eval NE {teacher_ne:.4f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("normalized entropy (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "ne.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def format_table(summary: dict[str, object], keys: list[str]) -> str:
    """The summary's `keys` as aligned rows; a metric that does not apply to this run (absent,
    or None such as the teacher's NE on a user's own data) has no row."""
    width = max(len(k) for k in keys)
    lines = []
    for k in keys:
        if summary.get(k) is None:
            continue
        v = summary[k]
        if isinstance(v, float):
            v = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4f}"
        elif isinstance(v, int):
            v = f"{v:,}"
        lines.append(f"  {k:<{width}}  {v}")
    return "\n".join(lines)
