"""Model selection on a validation tail: which evaluation was best, and when to stop.

Early stopping as in Prechelt, "Early Stopping - But When?" (1998): keep the model of the
best validation score seen so far; stop once `patience` evaluations in a row did not beat it.
A tie is not an improvement (the earlier model is kept).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ModelSelection:
    higher_is_better: bool = False
    patience: int | None = None  # evaluations without improvement before stopping (None: never)
    best: float | None = None
    best_at: dict[str, object] = field(default_factory=dict)  # what `observe` was told of the best
    since_best: int = 0
    evaluations: int = 0

    def observe(self, value: float, **where: object) -> bool:
        """Note one evaluation; True when it is the best so far (a NaN never is)."""
        self.evaluations += 1
        better = math.isfinite(value) and (
            self.best is None
            or (value > self.best if self.higher_is_better else value < self.best))
        if better:
            self.best, self.best_at, self.since_best = value, dict(where), 0
        else:
            self.since_best += 1
        return better

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience


def validation_points(per_epoch: int, epochs: int, points: int) -> list[int]:
    """Trainer examples at which to validate: `points` evenly within each epoch (at least
    one: its end), so each epoch's end is one of them."""
    points = max(1, points)
    return [round(e * per_epoch + i * per_epoch / points)
            for e in range(epochs) for i in range(1, points + 1)]


def gate_step(point: int, workers: int, batch_size: int) -> int:
    """The step at which each of a trainer's `workers` waits for validation point `point`
    (trainer examples): the first at which they have read it together, ceil(point / (W x B))."""
    return -(-point // (workers * batch_size))


class ValidatedMark:
    """The last validation point trainer 0 has validated, in a file every worker of the job
    reads (under OUT, as the job's other flags): a worker at a point's gate step waits until
    the mark reaches it, so no point is passed unvalidated however fast the data goes.
    Trainer 0 resets it before the job meets; a worker that finds no mark once training has
    begun runs on a host with its own OUT, which trainer 0 never marks, and does not wait."""

    DONE = math.inf  # trainer 0 validates no more: no worker waits

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def get(self) -> float | None:
        """The point last validated (-1: none yet), or None where there is no mark."""
        try:
            return float(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # a reader that met the rename: as good as not yet
            return -1.0

    def set(self, point: float) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        tmp.write_text(repr(float(point)))
        os.replace(tmp, self.path)

    def reset(self) -> None:
        """No point validated yet."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.set(-1.0)
