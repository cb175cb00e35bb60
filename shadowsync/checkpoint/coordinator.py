"""Trainer 0 saves the whole job: when (`--checkpoint-every`), and in which order.

A save is two rounds over the processes that own state: first every trainer notes its
workers' positions (`mark_here`), then every process writes its shard (`save_here`) into one
staging directory, in parallel. Positions noted before any state is read mean that a resumed
run skips no example; the steps workers take between the two rounds are in the saved state
and will be trained again (the manifest counts them). The step is published by a rename only
when every shard is written and finite: a NaN is never saved as a good checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowsync.checkpoint import shards
from shadowsync.checkpoint.interval import parse_every
from shadowsync.checkpoint.store import CHECKPOINT_DIR, prune, publish, step_dir

log = logging.getLogger(__name__)

SAVE_TIMEOUT_S = 120.0
class Checkpointer:
    """Saves the job from trainer 0. `remote`: RPC names of the other processes that own a
    shard (trainers, embedding and dense servers); trainer 0's own shard is saved in-process.
    `examples(trainer, positions)`: rows the given per-worker step counts have read."""

    def __init__(self, run: Path, every: str, keep: int, config_toml: str,
                 trainers: int, remote: list[str], remote_trainers: list[str],
                 examples: Callable[[int, list[int]], int], resumable: bool,
                 manifest_extra: dict[str, Any] | None = None) -> None:
        self.run = Path(run)
        self.kind, self.every = parse_every(every)
        self.keep = keep
        self.config_toml = config_toml
        self.trainers = trainers
        self.remote = remote
        self.remote_trainers = remote_trainers
        self.examples = examples
        self.resumable = resumable
        self.extra = manifest_extra or {}
        self._last_t = time.monotonic()
        self._last_examples = 0
        # The job's examples from trainer 0's: given where the others' progress is known,
        # else trainer 0's times the trainers (trainers do not keep pace exactly).
        self.job_examples: Callable[[int], int] = lambda mine: mine * trainers
        self._count = 0
        self.latest: Path | None = None
        self.refused = 0  # saves refused because some state was not finite

    def resumed_at(self, examples: int) -> None:
        """The run resumed from a checkpoint of `examples`: the next one is an interval on."""
        self._last_examples = examples

    def maybe_save(self, examples_trainer0: int) -> Path | None:
        """Save if the interval has passed (examples: the job's, see `job_examples`)."""
        if not self.resumable or self.kind == "off":
            return None
        if self.kind == "seconds":
            if time.monotonic() - self._last_t < self.every:
                return None
        elif self.job_examples(examples_trainer0) - self._last_examples < self.every:
            return None
        self._last_examples = self.job_examples(examples_trainer0)
        return self.save(final=False)

    def keep_alive(self) -> None:
        """A stop is under way: the other processes wait for the final save (each extends
        its stop watchdog); nothing waits for the answers."""
        import torch.distributed.rpc as rpc

        for name in self.remote:
            try:
                rpc.rpc_async(name, shards.keep_alive, timeout=5)
            except Exception:  # noqa: BLE001 - a process already gone
                pass

    def save(self, final: bool, reason: str = "") -> Path | None:
        import torch.distributed.rpc as rpc

        t0 = time.perf_counter()
        self._last_t = time.monotonic()
        self._count += 1
        staging = self.run / CHECKPOINT_DIR / f".tmp-{os.getpid()}-{self._count}"
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
            shutil.rmtree(staging, ignore_errors=True)
            raise
        bad = {i["shard"]: i["not_finite"] for i in infos if i["not_finite"]}
        if bad:
            shutil.rmtree(staging, ignore_errors=True)
            self.refused += 1
            log.warning("checkpoint not saved: not finite in %s", bad)
            return None
        trained, twice, positions = 0, 0, {}
        for info in infos:
            workers = info.get("workers")
            if workers is None:
                continue
            t = int(info["shard"].removeprefix("trainer"))
            positions[info["shard"]] = workers["positions"]
            done = self.examples(t, workers["positions"])
            trained += done
            twice += max(0, self.examples(t, workers["steps"]) - done)
        manifest = {
            "step": trained, "examples": trained, "final": final, "reason": reason,
            "resumable": self.resumable, "positions": positions,
            "examples_trained_twice_on_resume": twice,
            "shards": sorted(i["shard"] for i in infos), "time": time.time(),
            "save_s": round(time.perf_counter() - t0, 3), **self.extra,
        }
        path = publish(staging, step_dir(self.run, trained), manifest, self.config_toml)
        prune(self.run, self.keep)
        self.latest = path
        log.info("checkpoint %s (%d examples, %.1fs)", path, trained, manifest["save_s"])
        return path
