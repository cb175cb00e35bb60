"""Trainer 0 of a --val-share job: it validates at each validation point with the whole job
parked there, keeps the best model as OUT/checkpoint/best, and decides for every trainer when
the learning-rate decay starts (--lr-decay-on-plateau) and when training ends (--early-stop).

Trainer 0 validates a point once every worker of the job is parked at it (or has ended), then
lets them all go on (`shadowsync.train.quiesce`). Without the wait, a small data set's job
trained past several points between two looks, and validated few of them; and workers
training on through a validation and the save of a new best model moved the model kept by a
quarter to most of an epoch past the one scored (MovieLens 100K, the default job), out of its
best point (the validation NE rises after it at every new epoch).

Late in a run each epoch's end model has over-fitted its own pass in its own way (the rise at
each new epoch: the one-epoch overfitting of CTR models), and their mean generalizes better
than any one of them. So from the end of epoch --weight-average-from on, each epoch's end model
is also folded into a running average (`shadowsync.rules.average`, stochastic weight
averaging), which is scored in its turn and kept as the best model where it validates better
than the one kept. The average never trains: decay and early stopping follow
the model that does. (MovieLens 100K, the default job: +0.0035 eval AUC, seeds 0-7 of its
tuning split.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from shadowsync.checkpoint.coordinator import Checkpointer
from shadowsync.checkpoint.store import BEST, MANIFEST
from shadowsync.runners.base import Runner
from shadowsync.train.notices import JobNotices
from shadowsync.train.progress import Progress
from shadowsync.train.quiesce import Quiescence
from shadowsync.train.selection import ModelSelection

log = logging.getLogger(__name__)


class Validation:
    """Trainer 0's validations. `score()`: the validation rows' metrics of the model now;
    `metric`: the one that selects (its key in `score()`, lower is better unless `selection`
    says); `job` parks and releases every trainer's workers, `notices` tells them what a
    validation decided; `trained_now()`: this trainer's examples so far, of `trainers` that
    train as many, a pass being `epoch_rows` rows; `sync` (held while it scores and saves),
    `checkpointer` (saves the best model) and `progress` (a row each) are the trainer's."""

    def __init__(self, score: Callable[[], dict[str, float]], metric: str,
                 selection: ModelSelection, *, job: Quiescence, notices: JobNotices,
                 trained_now: Callable[[], int], trainers: int, epoch_rows: int,
                 sync: Runner | None, checkpointer: Checkpointer | None,
                 progress: Progress, average_from: int = 0) -> None:
        self.score, self.metric, self.selection = score, metric, selection
        self.job, self.notices, self.trained_now = job, notices, trained_now
        self.trainers, self.epoch_rows = trainers, epoch_rows
        self.sync, self.checkpointer, self.progress = sync, checkpointer, progress
        self.average_from = average_from
        self.best_checkpoint: Path | None = None
        # The model kept as the best (the model trained, or the average): its score and where.
        self.kept: float | None = None
        self.kept_at: dict[str, object] = {}
        self.early_stopped = False
        self._last_examples: int | None = None
        self._due: list[tuple[int, int]] = []  # (gate step, trainer examples) to validate next

    def resume(self) -> None:
        """A resumed run goes on from the best model its run kept (a later one must beat it)."""
        if self.checkpointer is None:
            return
        best = self.checkpointer.root / BEST
        try:
            at = json.loads((best / MANIFEST).read_text())["best"]
            value = float(at[f"val_{self.metric}"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        self.selection.best, self.selection.best_at = value, at
        self.kept, self.kept_at = value, at
        self.best_checkpoint = best

    def begin(self, gates: tuple[tuple[int, int], ...], start: int, resumed: bool) -> None:
        """The job has met, this trainer's workers `start` examples into their shards:
        validate at the points of `gates` past it."""
        self._due = [g for g in gates if g[1] > start]
        self.notices.begin(resumed)

    @property
    def waiting(self) -> bool:
        """A validation point is still ahead (the trainer looks often whether it is due)."""
        return bool(self._due)

    def if_due(self) -> None:
        """Validate the next point once every worker of the job is parked at it (or has
        ended), then let them all go on."""
        if not self._due or self.early_stopped:
            return
        gate, point = self._due[0]
        parked = self.job.parked(gate)
        if parked is None:
            return
        # Points passed all the same (a worker whose shard ended short) are one validation.
        now = self.trained_now()
        passed = [p for _, p in self._due if p <= now] or [point]
        del self._due[:len(passed)]
        self.validate(parked=parked, point=passed[-1])
        if not self.early_stopped:
            self.job.release(passed[-1])

    def end(self) -> None:
        """No more validations while training (the trainer stops, or its workers are done):
        no worker of the job waits at a validation point."""
        self._due = []
        self.job.release_all()

    def validate(self, final: bool = False, parked: dict[str, list[int | None]] | None = None,
                 point: int | None = None) -> None:
        """Score the validation rows, keep the best model, and stop the job after
        --early-stop evaluations without improvement. `final`: after training, unless the
        last validation was just now. `parked`: where every worker of the job is parked
        meanwhile (none has moved since; `Quiescence`), noted in the best model's manifest.
        `point`: the validation point (trainer examples); at an epoch's end the average
        is folded and scored too (`_average`). No sync round of this trainer runs
        meanwhile either (nor, waiting for it, another's)."""
        wall, trained = self.progress.wall(), self.trained_now()
        if final and self.sync is None and (self._last_examples == trained
                                            or self.early_stopped):
            return  # the model it ends with is the one last validated (give or take a step)
        with self.sync.held() if self.sync is not None else nullcontext():
            trained = self._last_examples = self.trained_now()
            m = self.score()
            epoch = trained * self.trainers / self.epoch_rows
            where = {"epoch": round(epoch, 3), "examples": trained * self.trainers}
            improved = self.selection.observe(m[self.metric], **where, val_ne=m["ne"],
                                              val_auc=m["auc"])
            if improved:
                self._keep(m, where, parked)
            average = self._average(point, where, parked)
        log.info("epoch %.2f: validation NE %.4f, AUC %.4f%s", epoch, m["ne"], m["auc"],
                 " (best so far)" if improved else
                 f" ({self.selection.since_best} without improvement)")
        row = self.progress.row(wall)
        row.update({"examples": trained, "epoch": round(epoch, 4), "val_ne": m["ne"],
                    "val_auc": m["auc"], "best": improved})
        if average is not None:
            row.update({"average_val_ne": average["ne"], "average_val_auc": average["auc"]})
        self.progress.write(row)
        if not improved and self.notices.start_decay():
            log.info("learning-rate decay starts (--lr-decay-on-plateau)")
        if self.selection.should_stop and not final and not self.early_stopped:
            self.stop_early()

    def _keep(self, m: dict[str, float], where: dict[str, object],
              parked: dict[str, list[int | None]] | None) -> None:
        """Save the model in place now as the best, where its score `m` beats the one kept."""
        if not self.selection.beats(m[self.metric], self.kept):
            return
        self.kept, self.kept_at = m[self.metric], {**where, "val_ne": m["ne"],
                                                   "val_auc": m["auc"]}
        if self.checkpointer is not None:
            self.best_checkpoint = self.checkpointer.save_best(
                {**self.kept_at, **({"parked_steps": parked} if parked else {})})

    def _average(self, point: int | None, where: dict[str, object],
                 parked: dict[str, list[int | None]] | None) -> dict[str, float] | None:
        """At the end of epoch --weight-average-from and each later one: fold the model into
        the running average, and from two snapshots on score the average in the model's
        place, kept as the best where it beats the one kept; its metrics (None: not scored)."""
        per_epoch = self.epoch_rows // self.trainers
        if (not self.average_from or self.checkpointer is None or point is None
                or per_epoch < 1 or point % per_epoch or point < self.average_from * per_epoch):
            return None
        count = self.checkpointer.fold_average()
        if count < 2:  # an average of one is the model itself
            return None
        with self.checkpointer.average_in_place():
            m = self.score()
            self._keep(m, {**where, "averaged": count}, parked)
        log.info("epoch %.2f: average of %d epoch ends: validation NE %.4f, AUC %.4f%s",
                 where["epoch"], count, m["ne"], m["auc"],
                 " (kept)" if self.kept_at.get("averaged") == count else "")
        return m

    def stop_early(self) -> None:
        """End training after every worker's current step, the job's normal ending after it
        (final checkpoint, evaluation, summary)."""
        self.early_stopped = True
        log.info("early stop: %d validations without improvement", self.selection.since_best)
        self.notices.stop()
        self.end()
