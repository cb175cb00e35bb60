"""Trainer 0 saves the whole job: when (`--checkpoint-every`), and in which order.

A save is two rounds over the processes that own state: first every trainer notes its
workers' positions (`mark_here`), then every process writes its shard (`save_here`) into one
staging directory under the checkpoint root, in parallel (on the storage trainer 0 publishes
from, whichever host the process runs on). Positions noted before any state is read mean
that a resumed run skips no example; the steps workers take between the two rounds are in
the saved state and will be trained again (the manifest counts them). The step is published
(its manifest written last, `store.publish`) only when every shard is written, there and
finite: a NaN is never saved as a good checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch.distributed.rpc as rpc

from shadowsync.checkpoint import shards
from shadowsync.checkpoint.storage import Location, remove_tree
from shadowsync.checkpoint.store import BEST, prune, publish, staging_dir, step_dir
from shadowsync.errors import UserError
from shadowsync.spec.interval import CheckpointEvery

log = logging.getLogger(__name__)

SAVE_TIMEOUT_S = 120.0
# An examples interval is a promise: one failure loses at most that many examples. A save
# therefore starts early enough to be published before the job is an interval past the last
# one: ahead by what the job trains while it saves (the last save's time) and while a failure
# is being noticed and the survivors stop (this long).
LEAD_S = 0.5
PACE_WINDOW_S = 2.0  # the job's pace over this much recent time


class NoSpace(UserError):
    """A shard would not fit on its disk: nothing of this save is kept, the newest published
    checkpoint stays. A periodic save is skipped; a final one ends the job with this line."""


class Checkpointer:
    """Saves the job from trainer 0 under `root` (`store.checkpoints_at`). `remote`: RPC
    names of the other processes that own a shard (trainers, embedding and dense servers);
    trainer 0's own shard is saved in-process.
    `examples(trainer, positions)`: rows the given per-worker step counts have read.
    `aligned`: the workers run in lockstep and must all resume at one step, the smallest
    position of the job (the manifest's `aligned_at`; what is past it is trained again).
    `remote_tables`: the RPC names of the processes that hold embedding rows (a model
    average keeps theirs beside them)."""

    def __init__(self, root: Location, every: CheckpointEvery, keep: int, config_toml: str,
                 trainers: int, remote: list[str], remote_trainers: list[str],
                 examples: Callable[[int, list[int]], int], resumable: bool,
                 manifest_extra: dict[str, object] | None = None, aligned: bool = False,
                 remote_tables: list[str] | None = None) -> None:
        self.root = root
        self.kind, self.every = every.kind, every.value
        self.keep = keep
        self.config_toml = config_toml
        self.trainers = trainers
        self.remote = remote
        self.remote_trainers = remote_trainers
        self.remote_tables = remote_tables or []
        self.examples = examples
        self.resumable = resumable
        self.extra = manifest_extra or {}
        self.aligned = aligned
        self._last_t = time.monotonic()
        self._last_examples = 0  # what the newest checkpoint holds (the job's examples)
        self._save_s = 0.0  # how long the last save took
        self._pace: list[tuple[float, int]] = []  # (time, job's examples), recent
        # The job's examples from trainer 0's: given where the others' progress is known,
        # else trainer 0's times the trainers (trainers do not keep pace exactly).
        self.job_examples: Callable[[int], int] = lambda mine: mine * trainers
        self._count = 0
        self.latest: Location | None = None
        self.refused = 0  # saves refused because some state was not finite

    def resumed_at(self, examples: int) -> None:
        """The run resumed from a checkpoint of `examples`: the next one is an interval on."""
        self._last_examples = examples

    def maybe_save(self, examples_trainer0: int) -> Location | None:
        """Save if the interval is (about to be) over (examples: the job's, see
        `job_examples`; called often, every tick of trainer 0)."""
        if not self.resumable or self.kind in ("off", "never"):
            return None
        if self.kind == "seconds":
            if time.monotonic() - self._last_t < self.every:
                return None
        elif self.ahead(self.job_examples(examples_trainer0)) - self._last_examples < self.every:
            return None
        try:
            return self.save(final=False)
        except NoSpace as e:  # the job goes on; its newest checkpoint stays as it was
            log.warning("%s; training goes on", e)
            return None

    def ahead(self, job: int) -> float:
        """The job's examples `job` now, plus what it trains in a save and LEAD_S more at its
        recent pace (at most half an interval)."""
        now = time.monotonic()
        self._pace = [(t, n) for t, n in self._pace if now - t <= PACE_WINDOW_S]
        self._pace.append((now, job))
        (t0, n0), (t1, n1) = self._pace[0], self._pace[-1]
        pace = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        # At most half an interval ahead: an interval shorter than a save is not kept anyway,
        # and saves back to back would only slow the job.
        return job + min(pace * (self._save_s + LEAD_S), self.every / 2)

    def keep_alive(self) -> None:
        """A stop is under way and making progress: this process and the others wait for the
        final save (each extends its stop watchdog); nothing waits for the answers."""
        shards.keep_alive()
        for name in self.remote:
            try:
                rpc.rpc_async(name, shards.keep_alive, timeout=5)
            except Exception:  # noqa: BLE001 - a process already gone
                pass

    def save_best(self, best: dict[str, object]) -> Location | None:
        """Save the job as it is now as `root`/best (replacing the one before),
        `best` (where and how well it validated) in its manifest. Not a step: it is never
        pruned and never resumed from unless named."""
        try:
            return self.save(final=False, reason="best", best=best)
        except NoSpace as e:
            log.warning("%s; training goes on", e)
            return None

    def fold_average(self) -> int:
        """Fold the model as it is now (trainer 0's dense model, its own tables or the
        embedding servers' rows) into the running average each of those processes keeps of
        its part (`shards.fold_average_here`); the snapshots folded so far."""
        futs = [rpc.rpc_async(n, shards.fold_average_here, timeout=SAVE_TIMEOUT_S)
                for n in self.remote_tables]
        count = shards.fold_average_here()
        for fut in futs:
            fut.wait()
        return count

    @contextmanager
    def average_in_place(self) -> Iterator[None]:
        """The running average in the model's place while the block runs (to score it, and
        save it as the best), the model back after."""
        self._swap_average()
        try:
            yield
        finally:
            self._swap_average()

    def _swap_average(self) -> None:
        futs = [rpc.rpc_async(n, shards.swap_average_here, timeout=SAVE_TIMEOUT_S)
                for n in self.remote_tables]
        shards.swap_average_here()
        for fut in futs:
            fut.wait()

    def save(self, final: bool, reason: str = "",
             best: dict[str, object] | None = None) -> Location | None:
        t0 = time.perf_counter()
        self._last_t = time.monotonic()
        self._count += 1
        staging = staging_dir(self.root, f"{os.getpid()}-{self._count}")
        staging.mkdir(parents=True, exist_ok=True)
        try:
            for fut in [rpc.rpc_async(n, shards.mark_here, timeout=SAVE_TIMEOUT_S)
                        for n in self.remote_trainers]:
                fut.wait()
            shards.mark_here()
            futs = [rpc.rpc_async(n, shards.save_here, args=(str(staging),),
                                  timeout=SAVE_TIMEOUT_S) for n in self.remote]
            infos = [shards.save_here(str(staging))] + [f.wait() for f in futs]
        except BaseException:
            remove_tree(staging)
            raise
        short = [i["no_space"] for i in infos if i.get("no_space")]
        if short:
            remove_tree(staging)
            raise NoSpace(f"checkpoint not saved in {self.root}: {short[0]}")
        bad = {i["shard"]: i["not_finite"] for i in infos if i["not_finite"]}
        if bad:
            remove_tree(staging)
            self.refused += 1
            # Not a warning: the divergence that follows says it in its one line.
            log.info("checkpoint not saved: not finite in %s", bad)
            return None
        trained, twice, positions = 0, 0, {}
        workers_of = {i["shard"]: i["workers"] for i in infos if i.get("workers") is not None}
        aligned_at = min((p for w in workers_of.values() for p in w["positions"]),
                         default=None) if self.aligned else None
        for shard, workers in workers_of.items():
            t = int(shard.removeprefix("trainer"))
            if aligned_at is not None:
                workers = {**workers, "positions": [aligned_at] * len(workers["positions"])}
            positions[shard] = workers["positions"]
            done = self.examples(t, workers["positions"])
            trained += done
            twice += max(0, self.examples(t, workers["steps"]) - done)
        manifest = {
            "step": trained, "examples": trained, "final": final, "reason": reason,
            "resumable": self.resumable, "positions": positions,
            "examples_trained_twice_on_resume": twice, "aligned_at": aligned_at,
            "shards": sorted(i["shard"] for i in infos), "time": time.time(),
            "save_s": round(time.perf_counter() - t0, 3), **self.extra,
        }
        if best is not None:
            manifest["best"] = best
            return publish(staging, self.root / BEST, manifest, self.config_toml)
        path = publish(staging, step_dir(self.root, trained), manifest, self.config_toml)
        prune(self.root, self.keep)
        self.latest = path
        self._last_examples = trained
        self._save_s = time.perf_counter() - t0
        log.info("checkpoint %s (%d examples, %.1fs)", path, trained, manifest["save_s"])
        return path
