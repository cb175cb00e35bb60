"""`bench switch --slow-link`: the straggler as a slow network link instead of slow compute,
every process of the job on its own emulated host."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from shadowsync.bench.common import Job, interleaved, median_of
from shadowsync.bench.slow_net import run_on_hosts
from shadowsync.bench.switch.ratios import paired
from shadowsync.bench.switch.runs import spread, switch_fields
from shadowsync.bench.switch.scenarios import WINDOW_LENGTH, WINDOW_START
from shadowsync.cluster.netns import (
    NetnsHosts,
    netns_unavailable_reason,
    shaping_unavailable_reason,
)
from shadowsync.cluster.parts import layout_of, resolve
from shadowsync.lifecycle.attempts import trained
from shadowsync.transport.rpc import RPC_CHANNELS_ENV

# --slow-link: the variants run with every process on its own emulated host.
LINK_VARIANTS = {"bsp+slow-link": ("bsp", "plan"), "greedy+slow-link": ("switch", "greedy")}


class LinkWindow:
    """A `run_on_hosts` watch that limits the link between two hosts for the same window of
    the job as the compute straggler's (`WINDOW_START`, `WINDOW_LENGTH`), read from the
    examples the trainers note as they train, and lifts the limit after it (or when the job
    ends). Records the job's progress at each change."""

    def __init__(self, hosts: Any, pair: tuple[int, int], mbit: float, examples: int,
                 trainers: int) -> None:
        self.hosts, self.pair, self.mbit = hosts, pair, mbit
        self.examples, self.trainers = examples, trainers
        self.changes: list[tuple[float, float | None]] = []  # (progress, rate)

    def progress(self, out: Path) -> float:
        return trained(out, 0, self.trainers) / self.examples

    def __call__(self, out: Path, done: Any) -> None:
        self.changes = []
        end = WINDOW_START + WINDOW_LENGTH
        limited = False
        try:
            while not done.wait(0.02):
                at = self.progress(out)
                if not limited and WINDOW_START <= at < end:
                    self.hosts.set_pair_rate(*self.pair, self.mbit)
                    limited = True
                    self.changes.append((at, self.mbit))
                elif limited and at >= end:
                    break
        finally:
            if limited:
                self.hosts.set_pair_rate(*self.pair, None)
                self.changes.append((self.progress(out), None))


def bench_slow_link(job: Job, repeats: int, mbit: float) -> dict[str, Any]:
    """The straggler as a slow link instead of slow compute: every process of the job on its
    own emulated host (network namespaces, `cluster.netns`, launched by torchrun as in
    `bench sync`'s slow-network part), and the path between trainer 1's host and the dense
    server's limited to `mbit` Mbit/s (tc htb) for the middle half of the job, as the
    compute straggler (`LinkWindow`), so each of trainer 1's pushes and pulls then crosses
    it slowly. BSP and greedy, interleaved, seed r per repeat, each run under `job.root`."""
    reason = netns_unavailable_reason() or shaping_unavailable_reason()
    if reason:
        print(f"bench switch: slow-link part skipped: {reason}")
        return {"skipped": reason}
    base = job.base
    layout = layout_of(resolve(job.config(sync="bsp")).cluster)
    slow = (layout.embedding_servers, layout.trainer_rank(1))  # dense server 0, trainer 1
    seeds: dict[str, int] = {}

    def go(variant: str) -> Any:
        sync, policy = LINK_VARIANTS[variant]

        def run() -> dict[str, Any]:
            seed = base.seed + seeds.setdefault(variant, 0)  # repeat r: seed r
            seeds[variant] += 1
            cfg = resolve(job.config(sync=sync, switch_policy=policy, seed=seed))
            out = job.out(variant)
            t0 = time.perf_counter()
            s = run_on_hosts(hosts, cfg, out, watch=window)
            return {"seed": seed, "train_s": s["train_s"], "run_s": time.perf_counter() - t0,
                    "metric": s["eval_accuracy"], "link_changes": window.changes,
                    **switch_fields(s)}
        return run

    before = os.environ.get(RPC_CHANNELS_ENV)
    os.environ[RPC_CHANNELS_ENV] = "basic"  # tensors cross the emulated link (see there)
    try:
        with NetnsHosts(layout.world_size) as hosts:
            window = LinkWindow(hosts, slow, mbit, base.data.examples, base.cluster.trainers)
            runs = interleaved({v: go(v) for v in LINK_VARIANTS}, repeats,
                               f"bench switch: slow link {mbit:g} Mbit/s")
    finally:
        if before is None:
            os.environ.pop(RPC_CHANNELS_ENV, None)
        else:
            os.environ[RPC_CHANNELS_ENV] = before
    keys = ("train_s", "metric")
    med = {v: {k: median_of(runs, v, k) for k in keys} for v in LINK_VARIANTS}
    return {"runs": runs, "mbit": mbit, "hosts": layout.world_size, "medians": med,
            "spreads": {v: {k: spread(runs, v, k) for k in keys} for v in LINK_VARIANTS},
            "paired": paired(runs, "greedy+slow-link", "bsp+slow-link", "accuracy"),
            "switches": {v: median_of(runs, v, "switches") for v in LINK_VARIANTS}}


def slow_link_ratios(link: dict[str, Any]) -> dict[str, float]:
    """Greedy behind the slow link against BSP behind it: time ratio, accuracy points."""
    if "medians" not in link:  # skipped
        return {}
    m = link["medians"]
    return {"switch_time_vs_bsp_slow_link": (m["greedy+slow-link"]["train_s"]
                                             / m["bsp+slow-link"]["train_s"]),
            "switch_acc_minus_bsp_slow_link": 100.0 * (
                m["greedy+slow-link"]["metric"] - m["bsp+slow-link"]["metric"])}
