"""`shadowsync bench sync`: the same job under every way of synchronizing.

One job (data, model, examples, seed), run as a local cluster (2 trainers, 1 embedding
server) under none, s-ma, s-bmuf, DDP and PyTorch's own periodic model averaging (post-local
SGD) set to the sync rate s-ma reached, and the default job with private unshared tables
(the ceiling of the embedding path). Quality on one pass of the default data compares s-bmuf
with fr-bmuf, DDP, s-bmuf sending bf16 rounds, and the installed peers of other libraries
(TorchRec's DistributedModelParallel; `shadowsync.bench.peers`), which run on the same
examples.
`--full` adds s-easgd, the RPC-only embedding path, the foreground twins and the background
rules at several fixed intervals. Variants run interleaved, repeated, and are compared by
their medians; every ratio comes with its spread over the repeats and its goal. Optionally
the same job across network-namespace hosts, with and without a 50 Mbit/s limit on the links.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

import shadowsync.bench.slow_net as slow_net_bench
from shadowsync.bench import peers
from shadowsync.bench.common import (
    Job,
    interleaved,
    median_of,
    print_table,
    ratio_of_medians,
    torch_period,
    write_bench,
)
from shadowsync.config import TrainConfig
from shadowsync.errors import failure_line
from shadowsync.train.tasks import plan_data

RULES = ["none", "s-ma", "s-bmuf", "s-easgd", "fr-ma", "fr-bmuf", "fr-easgd", "ddp"]
INTERVALS = [0.0, 0.05, 0.2, 1.0]
FOREGROUND_EVERY = [5, 20, 200]
# The default run: what the ratios with goals need, nothing more (--full adds s-easgd, the
# RPC-only embedding path, the foreground twins and the intervals).
DEFAULT_RULES = ["none", "s-ma", "s-bmuf", "ddp"]
# Peers from other libraries (the optional `peers` extra) in the quality part, beside s-bmuf.
QUALITY_PEERS = ["torchrec"]
# The background rule whose syncs per minute the periodic peers (torch-fr-ma, torchft-ma) copy.
RATE_FROM = "s-ma"
# Every ratio's goal (None: reported, no goal). Kept in bench.json next to the values.
GOALS: dict[str, str | None] = {
    "s_ma_vs_none": ">= 0.97",
    "s_bmuf_vs_none": ">= 0.97",
    "s_ma_examples_per_cpu_vs_none": None,
    "s_ma_worker_cores_vs_none": None,
    "s_bmuf_examples_per_cpu_vs_none": None,
    "s_bmuf_worker_cores_vs_none": None,
    "s_easgd_vs_none": None,
    "s_bmuf_syncs_per_min": ">= 300",
    "background_vs_ddp": ">= 2",
    "background_vs_torch_fr_ma": ">= 1.15",
    "background_vs_torchft": None,
    "cluster_vs_local_tables": ">= 0.85",
    "cluster_vs_local_tables_rpc": None,
    "s_bmuf_ne_vs_fr_bmuf": "<= 1.0",
    "s_bmuf_ne_vs_ddp": "<= 1.005",
    "s_bmuf_ne_vs_teacher": "<= 1.03",
    "s_bmuf_ne_delta_vs_overwrite": None,
    "vs_torchrec": ">= 1.5",
    "ne_vs_torchrec": "<= 1.0",
    "background_eps_drop_slow_net": "<= 0.05",
    "ddp_eps_drop_slow_net": None,
    "background_vs_ddp_slow_net": ">= 3",
    "background_vs_torch_fr_ma_slow_net": ">= 1.5",
    "background_vs_torchft_slow_net": None,
    "background_vs_fr_ma_slow_net": None,
    "s_ma_vs_none_slow_net": None,
    "s_bmuf_vs_none_slow_net": None,
    "background_vs_ddp_1gbit": None,
    "background_vs_torch_fr_ma_1gbit": None,
    "background_vs_torchft_1gbit": None,
    "background_vs_fr_ma_1gbit": None,
    "s_ma_vs_none_1gbit": None,
    "s_bmuf_vs_none_1gbit": None,
    "bf16_syncs_per_min_vs_fp32_slow_net": ">= 1.8",
    # bf16 rounds' quality on the quality runs' full pass; on the slow link's 300k-example
    # runs it is reported (one run's NE there moves by about 0.5% between repeats).
    "s_bmuf_ne_bf16_vs_fp32": "<= 1.002",
    "s_bmuf_ne_bf16_vs_fp32_slow_net": None,
}


# Examples per throughput run: about 6 s of training at the default job's pace on loopback
# (at 150k, 2 s: start-up transients swung one job's EPS by 1.4x between repeats); on the
# namespace hosts, where the job is about half as fast, SLOW_NET_EXAMPLES.
EXAMPLES, EXAMPLES_FULL = 500_000, 1_000_000
SLOW_NET_EXAMPLES = 300_000


def job(examples: int, **kw: Any) -> TrainConfig:
    # No checkpoint: nothing reads it, and its write (the tables, 170 MB) took 1-2 s a run.
    base = dict(examples=examples, trainers=2, workers=1, embedding_servers=1,
                eval_points=0, progress=False, log_every=10**12, checkpoint_every="never")
    return TrainConfig(**{**base, **kw}).validate()


def run_fields(s: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a run's summary."""
    return {
        "eps": s["train_eps"], "eval_ne": s["eval_ne"], "eval_auc": s.get("eval_auc"),
        "syncs_per_min": s["syncs_per_min"],
        "sync_blocked_fraction": s["sync_blocked_fraction"], "wall_s": s["wall_s"],
        "teacher_eval_ne": s["teacher_eval_ne"], "examples": s["examples"],
        "sync_bytes_per_round": s.get("sync_bytes_per_round"),
        "train_cpu_s": s["train_cpu_s"],
        **cpu_split(s["train_eps"], s["examples"], s["train_cpu_s"]),
    }


def cpu_split(eps: float, examples: int, worker_cpu_s: float) -> dict[str, float | None]:
    """EPS as the product of two factors, where a sync's cost on the workers' cores shows:
    eps = examples_per_cpu_s x worker_cores, with examples_per_cpu_s = examples /
    worker_cpu_s (what an example costs the Hogwild workers: more with cache misses on
    parameters the averaging wrote) and worker_cores = worker_cpu_s x eps / examples (the
    cores they held while training: fewer when the sync's own CPU takes its share)."""
    if not worker_cpu_s or not examples:
        return {"examples_per_cpu_s": None, "worker_cores": None}
    return {"examples_per_cpu_s": examples / worker_cpu_s,
            "worker_cores": worker_cpu_s * eps / examples}


def run_sync_bench(out: str, examples: int | None = None, repeats: int = 3,
                   slow_net: bool = True, quality_examples: int | None = None,
                   full: bool = False, slow_net_only: bool = False) -> dict[str, Any]:
    """The default fits a working day on 2 cores: the rules the ratios with goals compare,
    the default job against the same trainers with unshared local tables, quality on one pass
    of the default data beside the installed peers (TorchRec), then the slow-network part.
    `full` adds s-easgd, the RPC-only embedding path, the intervals, the foreground frontier
    and the overwrite write-back, on 3M examples of quality, and on the namespace hosts every
    way of syncing on a 50 Mbit/s and a 1 Gbit/s link. `slow_net_only` runs the namespace
    hosts part alone."""
    if examples is None:
        examples = EXAMPLES_FULL if full else EXAMPLES
    if quality_examples is None:
        quality_examples = 3_000_000 if full else 1_500_000
    root = Path(out)
    (root / "runs.jsonl").unlink(missing_ok=True)
    base = job(examples)
    torchft_reason = peers.missing("torchft")
    print(f"bench sync: {torchft_reason}" if torchft_reason else
          "bench sync: peer torchft (LocalSGD) runs beside s-ma at s-ma's syncs per minute")
    extra: dict[str, Any] = {"examples_per_run": examples, "repeats": repeats, "full": full,
                             "peers": {"torchft": torchft_reason or "runs"}}
    runs: list[dict[str, Any]] = []
    med: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    spreads: dict[str, list[float]] = {}
    if not slow_net_only:
        runs, med, ratios, spreads, loopback = _on_loopback(
            JobRuns(root / "runs", base), root / "runs.jsonl", repeats, quality_examples, full,
            torchft_reason)
        extra["peers"].update(loopback.pop("peers"))
        extra.update(loopback)
    if slow_net or slow_net_only:
        net_job = Job(root / "slow-net", replace(base, examples=min(examples, SLOW_NET_EXAMPLES)))
        plan_data(net_job.base)
        drops = slow_net_bench.run_slow_net(net_job, repeats, full=full,
                                            torchft=torchft_reason is None)
        ratios.update(drops.pop("ratios"))
        spreads.update(drops.pop("spreads", {}))
        extra["slow_net"] = drops
    extra["ratio_spread"] = spreads
    extra["goals"] = {k: GOALS.get(k) for k in ratios}
    if med:
        print_table([[v, m["eps"], m["syncs_per_min"], m["eval_ne"], m["sync_blocked_fraction"]]
                     for v, m in med.items()],
                    ["variant", "EPS", "syncs/min", "eval NE", "blocked"])
        print()
    print_table([[k, v if v is not None else "n/a",
                  " - ".join(_fmt_num(x) for x in spreads.get(k, [])) or "",
                  GOALS.get(k) or ""] for k, v in ratios.items()],
                ["ratio", "value", "spread (per repeat)", "goal"])
    path = write_bench(root, "sync", runs, ratios, extra)
    if med:
        plot_sync_bench(root, runs, med)
    print(f"wrote {path}")
    return {"ratios": ratios, "medians": med, "ratio_spread": spreads}


def _on_loopback(runner: JobRuns, log: Path, repeats: int, quality_examples: int, full: bool,
                 torchft_reason: str | None) -> tuple[Any, ...]:
    """The local-cluster part: throughput and quality runs (each written to `log` as it
    ends), their medians, ratios, spreads and what bench.json says of them."""
    plan_data(runner.base)
    torchft = full and torchft_reason is None
    variants = _throughput_variants(runner, full, torchft)
    runs = interleaved(variants, repeats, "bench sync: throughput", log=log)
    # Quality needs a full pass of the default job; throughput settles much sooner.
    quality = JobRuns(runner.root, job(quality_examples), runner.counter)
    plan_data(quality.base)
    q_variants = {f"{name}/quality": quality.variant(f"{name}-quality", sync=name)
                  for name in ("s-bmuf", "fr-bmuf", "ddp")}
    q_variants["s-bmuf/bf16/quality"] = quality.variant(
        "s-bmuf-bf16-quality", sync="s-bmuf", sync_dtype="bf16")
    if full:
        q_variants["s-bmuf/overwrite/quality"] = quality.variant(
            "s-bmuf-overwrite-quality", sync="s-bmuf", write_back="overwrite")
    peer_runs = peer_variants(quality)
    q_variants.update(peer_runs.pop("variants"))
    q_runs = interleaved(q_variants, repeats, "bench sync: quality", log=log)
    runs += q_runs
    variants.update(q_variants)
    med = {v: {k: median_of(runs, v, k) for k in
               ("eps", "eval_ne", "syncs_per_min", "sync_blocked_fraction")} for v in variants}
    teacher = next((r["teacher_eval_ne"] for r in q_runs if r.get("teacher_eval_ne")), None)
    ratios: dict[str, Any] = {}
    spreads: dict[str, list[float]] = {}
    torchrec = "torchrec/quality" in q_variants
    for name, (num, den, key) in _pairs(full, torchft, torchrec, teacher).items():
        if den is None:
            ratios[name] = None  # --full only, or no teacher
            continue
        ratios[name], spreads[name] = ratio_of_medians(runs, num, den, key)
    extra = {"quality_examples": quality_examples, "medians": med, "peers": peer_runs["status"]}
    return runs, med, ratios, spreads, extra


@dataclass(eq=False)
class JobRuns(Job):
    """Variants of one job (`base`) as runs, each in its own numbered directory under
    `root` (`counter` numbers them; runs of several jobs may share one); `rate` keeps the
    last run of the rule whose syncs per minute the periodic peers copy (`RATE_FROM`)."""

    rate: dict[str, Any] = field(default_factory=dict)

    def variant(self, name: str, keep: dict[str, Any] | None = None,
                **changes: Any) -> Callable[[], dict[str, Any]]:
        """The job with `changes` (flat options) as a run; `keep` takes its result."""
        def go() -> dict[str, Any]:
            r = run_fields(self.run(self.out(name), **changes))
            if keep is not None:
                keep.update(r)
            return r
        return go

    def period(self) -> int:
        """Steps between the periodic peers' rounds: RATE_FROM's rate, once it has run."""
        if not self.rate:
            return self.base.sync.every
        return torch_period(self.rate, self.base.cluster, self.base.optim.batch_size)

    def torch_fr_ma(self) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            period = self.period()
            r = run_fields(self.run(self.out("torch-fr-ma"), sync="torch-fr-ma",
                                    sync_every=period))
            r["period"] = period
            return r
        return go

    def torchft_ma(self) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            return peers.runner("torchft")(replace(self.base, sync_every=self.period()),
                                           self.out("torchft-ma"))
        return go


def _throughput_variants(runner: JobRuns, full: bool,
                         torchft: bool) -> dict[str, Callable[[], dict[str, Any]]]:
    """The rules, the periodic peers at RATE_FROM's rate, the embedding paths and (`full`)
    the intervals and the foreground frontier."""
    rules = RULES if full else DEFAULT_RULES
    variants = {name: runner.variant(name, sync=name) for name in rules}
    variants[RATE_FROM] = runner.variant(RATE_FROM, keep=runner.rate, sync=RATE_FROM)
    variants["torch-fr-ma"] = runner.torch_fr_ma()
    # torchft's LocalSGD at the same rate, where the peer can run here: on loopback with
    # `full` (no goal here; the torchft ratio is on the slow link, which always runs it).
    if torchft:
        variants["torchft-ma"] = runner.torchft_ma()
    # The embedding path: the default job with private unshared tables (and over RPC only).
    if full:
        variants["s-bmuf/rpc"] = runner.variant("s-bmuf/rpc", embedding_transport="rpc")
    variants["s-bmuf/unshared-tables"] = runner.variant(
        "s-bmuf/unshared-tables", embedding_transport="unshared")
    if full:
        for rule in ("s-ma", "s-bmuf"):
            for iv in INTERVALS:
                name = f"{rule}@{iv}s"
                variants[name] = runner.variant(name, sync=rule, sync_interval=str(iv))
        for every in FOREGROUND_EVERY:
            name = f"fr-bmuf@{every}steps"
            variants[name] = runner.variant(name, sync="fr-bmuf", sync_every=every)
    return variants


def _pairs(full: bool, torchft: bool, torchrec: bool, teacher: float | None
           ) -> dict[str, tuple[str, str | float | None, str]]:
    """Each loopback ratio: (numerator variant, denominator variant or value, the key); a
    denominator of None for a variant that did not run."""
    return {
        "s_ma_vs_none": ("s-ma", "none", "eps"),
        "s_bmuf_vs_none": ("s-bmuf", "none", "eps"),
        # each EPS ratio as the product of these two (`cpu_split`)
        "s_ma_examples_per_cpu_vs_none": ("s-ma", "none", "examples_per_cpu_s"),
        "s_ma_worker_cores_vs_none": ("s-ma", "none", "worker_cores"),
        "s_bmuf_examples_per_cpu_vs_none": ("s-bmuf", "none", "examples_per_cpu_s"),
        "s_bmuf_worker_cores_vs_none": ("s-bmuf", "none", "worker_cores"),
        "s_easgd_vs_none": ("s-easgd", "none", "eps"),
        "s_bmuf_syncs_per_min": ("s-bmuf", 1.0, "syncs_per_min"),
        "background_vs_ddp": ("s-ma", "ddp", "eps"),
        "background_vs_torch_fr_ma": ("s-ma", "torch-fr-ma", "eps"),
        "background_vs_torchft": ("s-ma", "torchft-ma" if torchft else None, "eps"),
        "cluster_vs_local_tables": ("s-bmuf", "s-bmuf/unshared-tables", "eps"),
        "cluster_vs_local_tables_rpc": ("s-bmuf/rpc", "s-bmuf/unshared-tables", "eps"),
        "s_bmuf_ne_vs_fr_bmuf": ("s-bmuf/quality", "fr-bmuf/quality", "eval_ne"),
        "s_bmuf_ne_vs_ddp": ("s-bmuf/quality", "ddp/quality", "eval_ne"),
        "s_bmuf_ne_vs_teacher": ("s-bmuf/quality", teacher, "eval_ne"),
        "s_bmuf_ne_bf16_vs_fp32": ("s-bmuf/bf16/quality", "s-bmuf/quality", "eval_ne"),
        "s_bmuf_ne_delta_vs_overwrite": ("s-bmuf/quality", "s-bmuf/overwrite/quality"
                                         if full else None, "eval_ne"),
        # The default job against TorchRec on the same examples (None: peer not installed).
        "vs_torchrec": ("s-bmuf/quality", "torchrec/quality" if torchrec else None, "eps"),
        "ne_vs_torchrec": ("s-bmuf/quality", "torchrec/quality" if torchrec else None,
                           "eval_ne"),
    }


def peer_variants(runs: JobRuns) -> dict[str, Any]:
    """The installed peers as quality variants ("NAME/quality") of the job of `runs`, and
    each peer's status: "runs", or the one line that says why it is skipped (also printed)."""
    variants: dict[str, Any] = {}
    status: dict[str, str] = {}
    for name in QUALITY_PEERS:
        reason = peers.missing(name)
        if reason:
            print(f"bench sync: {reason}")
            status[name] = reason
            continue
        print(f"bench sync: peer {name} runs beside s-bmuf on the quality examples")
        status[name] = "runs"

        def go(name: str = name) -> dict[str, Any]:
            """A peer that fails is reported in one line and left out of its ratios (its
            later repeats too), rather than end a bench that has run for minutes."""
            if status[name] == "runs":
                try:
                    return peers.runner(name)(runs.base, runs.out(f"{name}-quality"))
                except Exception as e:
                    status[name] = f"peer {name} failed: {failure_line(e)}"
                    print(f"bench sync: {status[name]}")
            return {"eps": None, "eval_ne": None, "wall_s": None}
        variants[f"{name}/quality"] = go
    return {"variants": variants, "status": status}


def _fmt_num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"


def plot_sync_bench(root: Path, runs: list[dict[str, Any]], med: dict[str, Any]) -> None:
    fig = Figure(figsize=(16, 4.5))
    axes = fig.subplots(1, 3)
    names = list(med)
    axes[0].barh(names, [med[n]["eps"] for n in names], color=[
        "tab:green" if n.startswith("s-") else "tab:red" if n.startswith("fr-") else "tab:gray"
        for n in names])
    axes[0].set_xlabel("examples / s (median)")
    axes[0].set_title("EPS by rule")
    for n in names:
        pts = [(r["wall_s"], r["eval_ne"]) for r in runs
               if r["variant"] == n and r.get("eval_ne") is not None]
        if pts:
            axes[1].scatter(*zip(*pts), label=n, s=18)
    axes[1].set_xlabel("wall time (s)")
    axes[1].set_ylabel("eval NE")
    axes[1].set_title("eval NE against wall time")
    axes[1].legend(fontsize=6)
    for prefix, color in (("s-", "tab:green"), ("fr-", "tab:red")):
        pts = sorted((med[n]["syncs_per_min"], med[n]["eps"]) for n in names
                     if n.startswith(prefix) and med[n]["syncs_per_min"] == med[n]["syncs_per_min"])
        if pts:
            axes[2].plot(*zip(*pts), "o-", color=color,
                         label="background" if prefix == "s-" else "foreground")
    axes[2].set_xscale("symlog")
    axes[2].set_xlabel("syncs per minute per trainer")
    axes[2].set_ylabel("examples / s")
    axes[2].set_title("frontier: throughput vs sync frequency")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(root / "sync.png", dpi=110)
