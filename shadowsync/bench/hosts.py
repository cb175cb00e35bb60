"""bench hosts: a job spread over emulated hosts against the same job on one host.

Each host is a mount and UTS namespace (its own host name and /dev/shm) in a network
namespace of its own (`cluster.hosts_apart` over `cluster.netns`), every host's link limited
to 1 Gbit/s by `tc`. This kernel has no netem, so the link adds no delay: what a one-way
delay of 0.2 ms would add is derived from the measured step times (`delay_cost`), not
measured. One torchrun agent per host (static rendezvous, `--node-rank`), so host h runs
ranks [h n, (h + 1) n).

Two jobs, each run all on one host (every rank on host 0) and spread over the hosts:

- two hosts: 2 embedding servers and 2 trainers. `first` placement puts both servers on
  host 0 and both trainers on host 1 (every row over the link); `per-host` gives each host
  one server and one trainer (half the rows through shared memory).
- four hosts: 4 embedding servers and 4 trainers, `per-host` (one of each on every host)
  and `first` (servers on hosts 0 and 1, trainers on hosts 2 and 3).

Spread runs take --prefetch 0, 1 and 2; the one-host runs the default (shared memory: no
round trip to hide). Every variant runs once per repeat, interleaved. A run reports EPS, eval
NE, and the bytes all hosts sent over their links (the veth counters) per worker step.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shadowsync.bench.common import (
    interleaved,
    median_of,
    print_table,
    ratio_of_medians,
    write_bench,
)
from shadowsync.bench.slow_net import run_on_hosts
from shadowsync.bench.sync import job
from shadowsync.cluster.hosts_apart import ApartHosts, apart_unavailable_reason
from shadowsync.cluster.netns import (
    NetnsHosts,
    netns_unavailable_reason,
    shaping_unavailable_reason,
)
from shadowsync.config import TrainConfig
from shadowsync.transport.rpc import RPC_CHANNELS_ENV

LINK_MBIT = 1000.0
DELAY_MS = 0.2  # the one-way delay the issue asks for; derived, not emulated (no netem)
SHM_BYTES = 2 * 2**30  # each host's /dev/shm: room for every table when one host runs all
DEFAULT_DEPTHS = (0, 1, 2)
# A run's limit: start-up on a loaded 2-core machine (a minute and more) and its examples at
# well under the slowest EPS seen there; a run that fails or hangs is recorded, not fatal.
START_S, SLOWEST_EPS = 180.0, 2_000.0
# Goals of the closing note: (ratio, goal). EPS per trainer is the job's EPS over its
# trainers, and the spread and one-host jobs have the same trainers, so their ratio is one.
GOALS = {"two_hosts_first_vs_one_host_d1": ">= 0.9, eval NE within the one-host runs' spread",
         "four_hosts_per_host_vs_one_host_d1": ">= 0.9 (EPS per trainer)"}


@dataclass(frozen=True)
class Variant:
    hosts: int  # hosts of the job's setting (2 or 4): its servers and trainers
    spread: bool  # over the hosts, or every rank on host 0
    placement: str = "first"
    depth: int | None = None  # --prefetch; None: the default

    @property
    def name(self) -> str:
        where = f"{self.placement}-d{self.depth}" if self.spread else "one-host"
        return f"h{self.hosts}-{where}"

    def config(self, examples: int) -> TrainConfig:
        kw: dict[str, Any] = {"embedding_servers": self.hosts, "trainers": self.hosts,
                              "embedding_placement": self.placement}
        if self.depth is not None:
            kw["prefetch"] = str(self.depth)
        return job(examples, **kw)


def plan(settings: tuple[int, ...], depths: tuple[int, ...]) -> list[Variant]:
    """Every variant in the order a repeat runs them (rotated from repeat to repeat)."""
    out: list[Variant] = []
    for h in settings:
        out.append(Variant(h, spread=False))
        first_depths = depths if h == 2 else tuple(d for d in depths if d == max(depths))
        out += [Variant(h, True, "first", d) for d in first_depths]
        out += [Variant(h, True, "per-host", d) for d in depths]
    return out


class HostsView:
    """The first `n` of an `ApartHosts` in network namespaces, as `run_on_hosts` reads hosts
    (their namespaces' names, addresses and interface, and `popen` on host i)."""

    def __init__(self, apart: Any, n: int) -> None:
        self.apart = apart
        self.hosts = apart.net.hosts[:n]
        self.ips = apart.addrs[:n]
        self.iface = apart.net.iface

    def popen(self, i: int, argv: list[str], **kw: Any) -> subprocess.Popen:
        return self.apart.popen(i, argv, **kw)


def link_bytes(net: Any) -> int:
    """Bytes every host has sent over its link so far (its veth's transmit counter): each
    byte between hosts leaves exactly one host's link."""
    total = 0
    for ns in net.hosts:
        res = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", net.iface],
                             capture_output=True, text=True, check=True, timeout=30)
        total += int(json.loads(res.stdout)[0]["stats64"]["tx"]["bytes"])
    return total


def run_variant(apart: Any, v: Variant, examples: int, out: Path,
                **options: Any) -> dict[str, Any]:
    """One run of `v` on the first hosts of `apart` (`options`: more of the job's options)."""
    cfg = replace(v.config(examples), **options)
    n = v.hosts if v.spread else 1
    nproc = cfg.cluster.embedding_servers + cfg.cluster.trainers
    before = link_bytes(apart.net)
    s = run_on_hosts(HostsView(apart, n), cfg, out, timeout=START_S + examples / SLOWEST_EPS,
                     nproc=nproc // n)
    sent = link_bytes(apart.net) - before
    batch, workers = cfg.optim.batch_size, cfg.cluster.workers * cfg.cluster.trainers
    steps = s["examples"] / batch
    return {"eps": s["train_eps"], "eps_per_trainer": s["train_eps"] / cfg.cluster.trainers,
            "eval_ne": s["eval_ne"], "examples": s["examples"], "wall_s": s["wall_s"],
            "link_bytes": sent, "link_bytes_per_step": sent / steps,
            # the workers' CPU a step (not the servers'): what a loaded machine leaves alone
            "worker_cpu_ms_per_step": 1000.0 * s["train_cpu_s"] / steps,
            # a worker's step, all workers running side by side
            "step_ms": 1000.0 * batch * workers / s["train_eps"],
            "prefetch": s.get("prefetch", v.depth)}


def delay_cost(runs: list[dict[str, Any]], variants: list[Variant]) -> dict[str, Any]:
    """What a one-way delay of DELAY_MS would add to each spread variant's step, from its
    measured step time t (ms): at depth 0 one round trip a step is on the critical path, so
    2 x DELAY_MS; at depth d >= 1 the rows for step k + d are asked for before step k, so the
    round trip r + 2 x DELAY_MS is hidden while it fits in d steps: max(0, r + 2 x DELAY_MS
    - d t). r, the round trip with no delay, is what depth 0 exposes: t(d0) - t(d) of the same
    setting and placement (0 where depth 0 was not run). The EPS factor is t / (t + added)."""
    out: dict[str, Any] = {}
    for v in variants:
        if not v.spread:
            continue
        t = median_of(runs, v.name, "step_ms")
        if t != t:  # NaN: every run of it failed
            continue
        if v.depth == 0:
            added = 2 * DELAY_MS
        else:
            d0 = median_of(runs, replace(v, depth=0).name, "step_ms")
            exposed = max(0.0, d0 - t) if d0 == d0 else 0.0  # NaN: depth 0 not run
            added = max(0.0, exposed + 2 * DELAY_MS - (v.depth or 1) * t)
        out[v.name] = {"step_ms": t, "added_ms": added, "eps_factor": t / (t + added)}
    return out


def ratios_of(runs: list[dict[str, Any]], variants: list[Variant]
              ) -> tuple[dict[str, float | None], dict[str, list[float]]]:
    """EPS (per trainer) of every spread variant over its setting's one-host runs, its eval NE
    over theirs, and whether its median NE lies within their spread (1 or 0); and the
    one-host runs' worker CPU a step over its own: the EPS a trainer with cores of its own
    would keep with the round trip hidden (this emulation's hosts share one machine's cores,
    so the job's EPS also pays the servers' and the kernel's share of the RPC work)."""
    ratios: dict[str, float | None] = {}
    spreads: dict[str, list[float]] = {}
    words = {2: "two", 4: "four"}
    for v in variants:
        if not v.spread:
            continue
        one = Variant(v.hosts, spread=False).name
        key = f"{words.get(v.hosts, v.hosts)}_hosts_{v.placement.replace('-', '_')}"
        eps, ne = f"{key}_vs_one_host_d{v.depth}", f"{key}_ne_vs_one_host_d{v.depth}"
        ratios[eps], spreads[eps] = ratio_of_medians(runs, v.name, one, "eps_per_trainer")
        ratios[ne], spreads[ne] = ratio_of_medians(runs, v.name, one, "eval_ne")
        cpu = f"{key}_worker_cpu_vs_one_host_d{v.depth}"
        ratios[cpu], spreads[cpu] = ratio_of_medians(runs, one, v.name, "worker_cpu_ms_per_step")
        ones = [r["eval_ne"] for r in runs if r["variant"] == one and "eval_ne" in r]
        mine = median_of(runs, v.name, "eval_ne")
        if ones:
            ratios[f"{key}_ne_within_one_host_spread_d{v.depth}"] = float(
                min(ones) <= mine <= max(ones))
    return ratios, spreads


def unavailable() -> str | None:
    return (apart_unavailable_reason() or netns_unavailable_reason()
            or shaping_unavailable_reason())


def run_hosts_bench(out: str, examples: int = 300_000, repeats: int = 3,
                    settings: tuple[int, ...] = (2, 4),
                    depths: tuple[int, ...] = DEFAULT_DEPTHS) -> dict[str, Any]:
    root = Path(out)
    reason = unavailable()
    if reason:
        print(f"bench hosts: skipped: {reason}")
        return {"skipped": reason}
    variants = plan(settings, depths)
    root.mkdir(parents=True, exist_ok=True)
    (root / "runs.jsonl").unlink(missing_ok=True)
    t0 = time.monotonic()
    before = os.environ.get(RPC_CHANNELS_ENV)
    # The hosts share one kernel, where TensorPipe's cross-memory-attach channel would move
    # the rows around the emulated link: over TCP they cross it, as between real hosts.
    os.environ[RPC_CHANNELS_ENV] = "basic"
    try:
        with NetnsHosts(max(settings), rate_mbit=LINK_MBIT) as net, \
                ApartHosts(max(settings), shm_bytes=SHM_BYTES, net=net, prefix="ssync-b") as apart:
            count: dict[str, int] = {}

            def runner(v: Variant) -> Any:
                def go() -> dict[str, Any]:
                    count[v.name] = count.get(v.name, -1) + 1
                    try:
                        return run_variant(apart, v, examples,
                                           root / f"{v.name}-{count[v.name]}")
                    except RuntimeError as e:  # the others still run; this one is said
                        print(f"bench hosts: {v.name} failed: {str(e)[:400]}")
                        return {"error": str(e)[:400]}
                return go

            runs = interleaved({v.name: runner(v) for v in variants}, repeats,
                               "bench hosts", log=root / "runs.jsonl")
    finally:
        if before is None:
            os.environ.pop(RPC_CHANNELS_ENV, None)
        else:
            os.environ[RPC_CHANNELS_ENV] = before
    ratios, extra = summary_of(runs, variants)
    extra.update(examples=examples, repeats=repeats, bench_wall_s=time.monotonic() - t0)
    path = write_bench(root, "hosts", runs, ratios, extra)
    table = extra["tables"][0]
    print_table(table["rows"], table["columns"])
    print(f"bench hosts: wrote {path}")
    return {"runs": runs, "ratios": ratios, **extra}


def summary_of(runs: list[dict[str, Any]], variants: list[Variant]
               ) -> tuple[dict[str, float | None], dict[str, Any]]:
    """The ratios, and the rest of bench.json: their spread, goals, the derived delay cost,
    medians, and a table of the variants for the page."""
    ratios, spreads = ratios_of(runs, variants)
    cost = delay_cost(runs, variants)
    keys = ("eps", "eps_per_trainer", "eval_ne", "link_bytes_per_step", "step_ms",
            "worker_cpu_ms_per_step")
    medians = {v.name: {k: median_of(runs, v.name, k) for k in keys} for v in variants}
    rows = []
    for v in variants:
        m = medians[v.name]
        ne = [r["eval_ne"] for r in runs if r["variant"] == v.name and "eval_ne" in r]
        if not ne:  # every run of it failed
            continue
        added = cost.get(v.name, {})
        rows.append([v.name, v.hosts if v.spread else 1, v.placement if v.spread else "",
                     "auto" if v.depth is None else v.depth, round(m["eps"]),
                     round(m["eps_per_trainer"]), f"{m['eval_ne']:.4f} ({min(ne):.4f} to "
                     f"{max(ne):.4f})", round(m["link_bytes_per_step"]),
                     round(m["step_ms"], 2), round(added.get("added_ms", 0.0), 2),
                     round(added.get("eps_factor", 1.0), 3)])
    repeats = len({r["repeat"] for r in runs})
    table = {"title": f"Medians per variant, {repeats} interleaved repeat{'s' * (repeats > 1)}; "
                      f"the last two columns derived for a {DELAY_MS} ms one-way delay, which "
                      "is not emulated",
             "columns": ["variant", "hosts", "placement", "--prefetch", "EPS",
                         "EPS per trainer", "eval NE (min to max)", "bytes a step over links",
                         "step ms", f"+ms a step at {DELAY_MS} ms", "EPS x at that delay"],
             "rows": rows}
    return ratios, {"ratio_spread": spreads,
                    "goals": {k: g for k, g in GOALS.items() if k in ratios},
                    "link_mbit": LINK_MBIT, "delay_ms_emulated": 0.0,
                    "delay_cost": {"one_way_ms": DELAY_MS, "variants": cost},
                    "medians": {name: {k: (None if x != x else x) for k, x in m.items()}
                                for name, m in medians.items()},  # NaN: no run measured it
                    "tables": [table]}
