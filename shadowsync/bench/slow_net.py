"""The sync bench across emulated hosts: does a slow network between trainers hurt?

Three network namespaces (the embedding server and each trainer on its own host) run the
job with the README's torchrun command line. The path between the two trainer hosts, which
carries synchronization, is then limited to 50 Mbit/s (htb; this kernel has no netem, so no
added delay) while the embedding paths stay fast, and the EPS of background sync and of DDP
is compared with the same hosts unlimited. "Background" is s-ma in every ratio, as on
loopback. On the slow link, s-ma also runs beside DDP and PyTorch's post-local SGD averaging
(`torch-fr-ma`) set to the syncs per minute that s-ma reached on that link in the same repeat,
the peer the issue compares on a real network; and background BMUF with rounds back to back
(so the link, not the CPU budget, sets the pace) sends fp32 or bf16 (`--sync-dtype`): syncs per
minute, bytes per round and eval NE compare the two. `full` adds a 1 Gbit/s link and every way
of syncing on both. Where torchft is installed, its LocalSGD (`torchft-ma`) runs on each
limited link too, at the same syncs per minute as torch-fr-ma.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from shadowsync.bench.common import Job, interleaved, median_of, ratio_of_medians, torch_period
from shadowsync.cluster.netns import (
    NetnsHosts,
    netns_unavailable_reason,
    shaping_unavailable_reason,
)
from shadowsync.config import TrainConfig
from shadowsync.lifecycle.attempts import reset

SLOW_MBIT = 50.0
GIGABIT_MBIT = 1000.0
# Foreground peers run beside s-ma at s-ma's syncs per minute on the same link (the default
# run: PyTorch's post-local SGD only; `full`: our foreground MA too). torchft joins where
# installed.
AT_MA_RATE = ("torch-fr-ma", "fr-ma")
# EPS ratios on each limited link: (name, numerator, denominator), "_slow_net" or "_1gbit"
# appended; a ratio whose variants did not run (not `full`) is None.
LINK_RATIOS = (("background_vs_ddp", "s-ma", "ddp"),
               ("background_vs_torch_fr_ma", "s-ma", "torch-fr-ma"),
               ("background_vs_torchft", "s-ma", "torchft-ma"),
               ("background_vs_fr_ma", "s-ma", "fr-ma"),
               ("s_ma_vs_none", "s-ma", "none"),
               ("s_bmuf_vs_none", "s-bmuf", "none"))
RATIOS = ("background_eps_drop_slow_net", "ddp_eps_drop_slow_net",
          *(f"{name}_{suffix}" for suffix in ("slow_net", "1gbit") for name, _, _ in LINK_RATIOS),
          "bf16_syncs_per_min_vs_fp32_slow_net", "s_bmuf_ne_bf16_vs_fp32_slow_net")
RDZV_PORT = 29400
# DDP on a limited link waits on its AllReduce at every step from the first one, so a third of
# the other runs' examples measures the same EPS (100k: 11.4k and 11.1k examples/s on 50
# Mbit/s; 300k: 11.3k and 11.2k) in a third of the time (9 s of training instead of 27).
LIMITED_DDP_SHARE = 1 / 3
# The share of the job's examples each way of syncing trains on a limited link, in the order
# they run there with `full`.
ON_LIMITED_LINK = {"none": 1.0, "s-bmuf": 1.0, "ddp": LIMITED_DDP_SHARE, "s-ma": 1.0}


def torchrun_argv(node_rank: int, nnodes: int, master_ip: str, config: Path,
                  out: Path, nproc: int = 1) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--node-rank", str(node_rank), "--nproc-per-node", str(nproc),
            "--rdzv-endpoint", f"{master_ip}:{RDZV_PORT}",
            "-m", "shadowsync.run", "--config", str(config), "--out", str(out)]


def run_on_hosts(hosts: Any, cfg: TrainConfig, out: Path, timeout: float = 600,
                 watch: Callable[[Path, threading.Event], None] | None = None,
                 nproc: int = 1) -> dict:
    """One job, `nproc` processes per host; returns trainer 0's summary. `watch(out, done)` runs
    in a thread while the job does, with the trainers noting their examples as they go
    (`lifecycle.attempts`); `done` is set when the job has ended."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    done = threading.Event()
    watcher = None
    if watch is not None:
        reset(out)  # the trainers note their progress there
        watcher = threading.Thread(target=watch, args=(out, done), daemon=True)
    config = out / "job.toml"
    config.write_text(replace(cfg, out=str(out), progress=False).to_toml())
    n = len(hosts.hosts)
    # gloo and TensorPipe otherwise pick the address the host name resolves to (loopback).
    env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.iface, "TP_SOCKET_IFNAME": hosts.iface}
    procs = [hosts.popen(i, torchrun_argv(i, n, hosts.ips[0], config, out, nproc), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    if watcher is not None:
        watcher.start()
    try:
        return _wait_for_hosts(procs, out, timeout)
    finally:
        done.set()
        if watcher is not None:
            watcher.join()


def _wait_for_hosts(procs: list[Any], out: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    errors = []
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # its own session (`NetnsHosts.popen`)
            try:
                p.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process out of the group holds its pipes
                pass
            errors.append(f"host {i} timed out")
            continue
        (out / f"host{i}.log").write_text(err)  # its agent's and processes' messages
        if p.returncode != 0:
            errors.append(f"host {i} exited {p.returncode}: {err.strip()[-800:]}")
    if errors:
        raise RuntimeError("; ".join(errors))
    return json.loads((out / "summary.json").read_text())


def at(rate: float | None) -> str:
    return "@unlimited" if rate is None else f"@{rate:g}mbit"


def on_limited_link(examples: int, sync: str) -> dict[str, Any]:
    """The changes that run a job of `examples` examples under `sync` on a limited link:
    its share of the examples (`ON_LIMITED_LINK`)."""
    share = ON_LIMITED_LINK[sync]
    return {"sync": sync, "examples": examples if share == 1 else round(examples * share)}


class LinkVariant(NamedTuple):
    """A run of the slow-network part: its job's flat `changes` (or the function of this
    repeat's runs so far that makes them) on the trainers' link at `rate` Mbit/s (None:
    unlimited)."""

    name: str
    changes: dict[str, Any] | Callable[[dict[str, dict[str, Any]]], dict[str, Any]]
    rate: float | None


def link_variants(job: Job, full: bool, torchft: bool) -> list[LinkVariant]:
    """The variants in the order they run each repeat: background MA and DDP with and
    without the limit, the ways of syncing on each limited link (`full`: both links, every
    way), the peers beside s-ma at s-ma's rate on the same link, and BMUF rounds back to back
    (the link is then the limit) sending fp32 or bf16 on the slow link. A variant's changes
    may be a function of the runs of this repeat so far (the peers' period comes from s-ma's
    rate)."""
    variants: list[LinkVariant] = [
        LinkVariant(f"{sync}{at(None)}", {"sync": sync}, None)
        for sync in (("s-ma", "ddp") if full else ("s-ma",))]
    for rate in (SLOW_MBIT, GIGABIT_MBIT) if full else (SLOW_MBIT,):
        syncs = tuple(ON_LIMITED_LINK) if full else ("ddp", "s-ma")
        variants += [LinkVariant(f"{sync}{at(rate)}",
                                 on_limited_link(job.base.data.examples, sync), rate)
                     for sync in syncs]
        peers = [*AT_MA_RATE[:None if full else 1], *(["torchft-ma"] if torchft else [])]
        for peer in peers:
            def at_ma_rate(this_repeat: dict[str, dict[str, Any]], sync: str = peer,
                           ma: str = f"s-ma{at(rate)}") -> dict[str, Any]:
                period = torch_period(this_repeat[ma], job.base.cluster,
                                      job.base.optim.batch_size)
                return {"sync": sync, "sync_every": period}
            variants.append(LinkVariant(f"{peer}{at(rate)}", at_ma_rate, rate))
    return variants + [LinkVariant(f"s-bmuf-{dtype}-back-to-back{at(SLOW_MBIT)}",
                        {"sync": "s-bmuf", "sync_interval": "0", "sync_dtype": dtype},
                        SLOW_MBIT) for dtype in ("fp32", "bf16")]


def on_hosts(hosts: Any, job: Job, variants: list[LinkVariant]) -> dict[str, Callable[[], dict]]:
    """The link variants of `job` as runs for `interleaved`, each under `job.root`: each sets
    the trainers' link, then runs its job on the hosts. Changes that are a function of the
    runs so far get the latest run of every variant, which is this repeat's for those that
    run before it."""
    latest: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}

    def run(v: LinkVariant) -> Callable[[], dict]:
        def go() -> dict[str, Any]:
            cfg = job.config(**(v.changes(latest) if callable(v.changes) else v.changes))
            hosts.set_pair_rate(1, 2, v.rate)
            repeat = count[v.name] = count.get(v.name, -1) + 1
            s = run_on_hosts(hosts, cfg, job.root / f"{v.name}-{repeat}")
            latest[v.name] = {"eps": s["train_eps"], "syncs_per_min": s.get("syncs_per_min"),
                              "sync_bytes_per_round": s.get("sync_bytes_per_round"),
                              "eval_ne": s["eval_ne"], "sync_every": cfg.sync.every}
            return latest[v.name]
        return go
    return {v.name: run(v) for v in variants}


def run_slow_net(job: Job, repeats: int, full: bool = False,
                 torchft: bool = False) -> dict[str, Any]:
    """The link variants of `job` on the namespace hosts, its runs under `job.root`. `full`
    adds DDP on the unlimited link (for `ddp_eps_drop_slow_net`); `torchft`, the peer on the
    slow link."""
    reason = netns_unavailable_reason() or shaping_unavailable_reason()
    if reason:
        print(f"bench sync: slow-network part skipped: {reason}")
        return {"skipped": reason, "ratios": dict.fromkeys(RATIOS)}
    root = job.root
    on_three_hosts = Job(root, job.config(dense_servers=0, trainers=2, embedding_servers=1))
    variants = link_variants(on_three_hosts, full, torchft)
    root.mkdir(parents=True, exist_ok=True)
    (root / "runs.jsonl").unlink(missing_ok=True)
    with NetnsHosts(3) as hosts:
        # ranks: 0 = embedding server (host 0), 1 and 2 = trainers (hosts 1 and 2)
        runs = interleaved(on_hosts(hosts, on_three_hosts, variants), repeats,
                           "bench sync: namespace hosts", log=root / "runs.jsonl")
        hosts.set_pair_rate(1, 2, None)

    slow = at(SLOW_MBIT)
    ratios: dict[str, Any] = {}
    spreads: dict[str, list[float]] = {}
    for sync, label in (("s-ma", "background"), ("ddp", "ddp")):
        kept, spread = ratio_of_medians(runs, f"{sync}{slow}", f"{sync}@unlimited", "eps")
        name = f"{label}_eps_drop_slow_net"
        ratios[name] = 1.0 - kept if kept is not None else None
        spreads[name] = [1.0 - x for x in reversed(spread)]
    for suffix, rate in (("slow_net", SLOW_MBIT), ("1gbit", GIGABIT_MBIT)):
        for name, num, den in LINK_RATIOS:
            ratios[f"{name}_{suffix}"], spreads[f"{name}_{suffix}"] = ratio_of_medians(
                runs, f"{num}{at(rate)}", f"{den}{at(rate)}", "eps")
    fp32, bf16 = (f"s-bmuf-{d}-back-to-back{slow}" for d in ("fp32", "bf16"))
    for name, key in (("bf16_syncs_per_min_vs_fp32_slow_net", "syncs_per_min"),
                      ("s_bmuf_ne_bf16_vs_fp32_slow_net", "eval_ne")):
        ratios[name], spreads[name] = ratio_of_medians(runs, bf16, fp32, key)
    bytes_per_round = {v: median_of(runs, v, "sync_bytes_per_round") for v in (fp32, bf16)}
    return {"runs": runs, "rate_mbit": SLOW_MBIT, "bytes_per_round": bytes_per_round,
            "ratios": ratios, "spreads": spreads}
