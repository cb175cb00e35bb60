"""`shadowsync bench sync`: the same job under every way of synchronizing.

One job (data, model, examples, seed), run as a local cluster (2 trainers, 1 embedding
server) under none, s-ma, s-bmuf, s-easgd, their foreground twins, DDP and PyTorch's own
periodic model averaging (post-local SGD) set to the sync rate s-ma reached; the background
rules also at several fixed intervals. Variants run interleaved, repeated, and are compared
by their medians. Optionally the same job across network-namespace hosts, with and without a
50 Mbit/s limit on the links.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from shadowsync.bench.common import interleaved, median_of, print_table, write_bench
from shadowsync.config import TrainConfig

RULES = ["none", "s-ma", "s-bmuf", "s-easgd", "fr-ma", "fr-bmuf", "fr-easgd", "ddp"]
INTERVALS = [0.0, 0.05, 0.2, 1.0]
FOREGROUND_EVERY = [5, 20, 200]


def job(examples: int, **kw: Any) -> TrainConfig:
    base = dict(examples=examples, trainers=2, workers=1, embedding_servers=1,
                eval_points=0, progress=False, log_every=10**12)
    return TrainConfig(**{**base, **kw}).validate()


def run_job(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    from shadowsync.api import run

    if out.exists():
        shutil.rmtree(out)
    _, s = run(replace(cfg, out=str(out)))
    return {
        "eps": s["train_eps"], "eval_ne": s["eval_ne"], "syncs_per_min": s["syncs_per_min"],
        "sync_blocked_fraction": s["sync_blocked_fraction"], "wall_s": s["wall_s"],
        "teacher_eval_ne": s["teacher_eval_ne"], "examples": s["examples"],
    }


def torch_period(ma_run: dict[str, Any], cfg: TrainConfig) -> int:
    """Steps between PyTorch averaging rounds that match s-ma's syncs per minute."""
    steps_per_min = ma_run["eps"] / cfg.trainers / cfg.workers / cfg.batch_size * 60
    rate = ma_run.get("syncs_per_min") or 1.0
    return max(1, round(steps_per_min / rate))


def run_sync_bench(out: str, examples: int = 300_000, repeats: int = 3,
                   slow_net: bool = True, quality_examples: int = 3_000_000) -> dict[str, Any]:
    from shadowsync.train.trainer import plan_data

    root = Path(out)
    base = job(examples)
    plan_data(base)
    last_ma: dict[str, Any] = {}
    counter = iter(range(10**6))

    def variant(name: str, cfg: TrainConfig) -> Any:
        def go() -> dict[str, Any]:
            r = run_job(cfg, root / "runs" / f"{name}-{next(counter)}")
            if name == "s-ma":
                last_ma.update(r)
            return r
        return go

    def torch_fr_ma() -> dict[str, Any]:
        period = torch_period(last_ma, base) if last_ma else base.sync_every
        cfg = replace(base, sync="torch-fr-ma", sync_every=period)
        r = run_job(cfg, root / "runs" / f"torch-fr-ma-{next(counter)}")
        r["period"] = period
        return r

    variants: dict[str, Any] = {name: variant(name, replace(base, sync=name)) for name in RULES}
    variants["torch-fr-ma"] = torch_fr_ma
    for rule in ("s-ma", "s-bmuf"):
        for iv in INTERVALS:
            name = f"{rule}@{iv}s"
            variants[name] = variant(name, replace(base, sync=rule, sync_interval=str(iv)))
    for every in FOREGROUND_EVERY:
        name = f"fr-bmuf@{every}steps"
        variants[name] = variant(name, replace(base, sync="fr-bmuf", sync_every=every))
    runs = interleaved(variants, repeats, "bench sync: throughput")
    # Quality needs a full pass of the default job; throughput settles much sooner.
    quality = job(quality_examples)
    plan_data(quality)
    q_variants = {f"{name}/quality": variant(f"{name}-quality", replace(quality, sync=name))
                  for name in ("s-bmuf", "fr-bmuf", "ddp")}
    q_variants["s-bmuf/overwrite/quality"] = variant(
        "s-bmuf-overwrite-quality", replace(quality, sync="s-bmuf", write_back="overwrite"))
    q_runs = interleaved(q_variants, repeats, "bench sync: quality")
    runs += q_runs
    variants.update(q_variants)
    med = {v: {k: median_of(runs, v, k) for k in
               ("eps", "eval_ne", "syncs_per_min", "sync_blocked_fraction")} for v in variants}
    background = [v for v in variants if v.startswith("s-") and "/" not in v]
    best_bg = max(med[v]["eps"] for v in background)
    teacher = next((r["teacher_eval_ne"] for r in q_runs if r.get("teacher_eval_ne")), None)

    def ne(name: str) -> float:
        return med[f"{name}/quality"]["eval_ne"]

    ratios = {
        "s_ma_vs_none": med["s-ma"]["eps"] / med["none"]["eps"],
        "s_bmuf_vs_none": med["s-bmuf"]["eps"] / med["none"]["eps"],
        "s_easgd_vs_none": med["s-easgd"]["eps"] / med["none"]["eps"],
        "s_bmuf_syncs_per_min": med["s-bmuf"]["syncs_per_min"],
        "background_vs_ddp": best_bg / med["ddp"]["eps"],
        "background_vs_torch_fr_ma": med["s-ma"]["eps"] / med["torch-fr-ma"]["eps"],
        "s_bmuf_ne_vs_fr_bmuf": ne("s-bmuf") / ne("fr-bmuf"),
        "s_bmuf_ne_vs_ddp": ne("s-bmuf") / ne("ddp"),
        "s_bmuf_ne_vs_teacher": ne("s-bmuf") / teacher if teacher else None,
        "s_bmuf_ne_delta_vs_overwrite": ne("s-bmuf") / ne("s-bmuf/overwrite"),
    }
    extra: dict[str, Any] = {"examples_per_run": examples, "quality_examples": quality_examples,
                             "repeats": repeats, "medians": med}
    if slow_net:
        from shadowsync.bench.slow_net import run_slow_net

        drops = run_slow_net(root / "slow-net", base, repeats)
        ratios.update(drops.pop("ratios"))
        extra["slow_net"] = drops
    print_table([[v, m["eps"], m["syncs_per_min"], m["eval_ne"], m["sync_blocked_fraction"]]
                 for v, m in med.items()],
                ["variant", "EPS", "syncs/min", "eval NE", "blocked"])
    print()
    print_table([[k, v if v is not None else "n/a"] for k, v in ratios.items()],
                ["ratio", "value"])
    path = write_bench(root, "sync", runs, ratios, extra)
    plot_sync_bench(root, runs, med)
    print(f"wrote {path}")
    return {"ratios": ratios, "medians": med}


def plot_sync_bench(root: Path, runs: list[dict[str, Any]], med: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    names = list(med)
    axes[0].barh(names, [med[n]["eps"] for n in names], color=[
        "tab:green" if n.startswith("s-") else "tab:red" if n.startswith("fr-") else "tab:gray"
        for n in names])
    axes[0].set_xlabel("examples / s (median)")
    axes[0].set_title("EPS by rule")
    for n in names:
        pts = [(r["wall_s"], r["eval_ne"]) for r in runs if r["variant"] == n]
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
    plt.close(fig)
