"""Model selection on a validation tail: which evaluation was best, and when to stop.

Early stopping as in Prechelt, "Early Stopping - But When?" (1998): keep the model of the
best validation score seen so far; stop once `patience` evaluations in a row did not beat it.
A tie is not an improvement (the earlier model is kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class ModelSelection:
    higher_is_better: bool = False
    patience: int | None = None  # evaluations without improvement before stopping (None: never)
    best: float | None = None
    best_at: dict[str, object] = field(default_factory=dict)  # what `observe` was told of the best
    since_best: int = 0
    evaluations: int = 0

    def beats(self, value: float, than: float | None) -> bool:
        """Whether score `value` is better than `than` (None: nothing yet); a NaN never is,
        nor a tie."""
        return math.isfinite(value) and (
            than is None or (value > than if self.higher_is_better else value < than))

    def observe(self, value: float, **where: object) -> bool:
        """Note one evaluation; True when it is the best so far (a NaN never is)."""
        self.evaluations += 1
        better = self.beats(value, self.best)
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


def validation_gates(per_epoch: int, epochs: int, points: int, workers: int,
                     batch_size: int) -> tuple[tuple[int, int], ...]:
    """(gate step, point) of each validation point (`validation_points`), as each of a
    trainer's `workers` waits at them."""
    return tuple((gate_step(v, workers, batch_size), v)
                 for v in validation_points(per_epoch, epochs, points))
