"""`shadowsync bench switch`: BSP, ASP and Sync-Switch side by side, with and without a
straggler (Li, Mangoubi, Xu, Guo, "Sync-Switch", ICDCS 2021, arXiv 2104.08364).

Every protocol trains the same job for the same total examples (a budget of gradients counted
on the dense servers). The straggler is one trainer 3x slower for the middle half of the
run, its window placed from the straggler-free BSP run's training time. Variants run
interleaved, repeated; medians are compared. Times are training times (first step to last),
so process start-up, the same for all, is left out.
"""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from shadowsync.bench.common import interleaved, median_of, print_table, write_bench
from shadowsync.config import TrainConfig

PROTOCOLS = ("bsp", "asp", "switch")
DIGITS_LR = 0.1  # the BSP learning rate; ASP and the switch's ASP phase run at lr / trainers
DIGITS_TARGET = 0.95  # accuracy for time-to-target
CTR_TARGET_NE = 0.95


def digits_job(trainers: int, examples: int, share: float) -> TrainConfig:
    return TrainConfig(task="digits", trainers=trainers, workers=1, embedding_servers=1,
                       examples=examples, batch_size=32, optimizer="sgd", lr=DIGITS_LR,
                       momentum=0.9, warmup_steps=0, switch_plan=f"bsp:{share:g},asp",
                       eval_points=6,
                       progress=False, log_every=10**12).validate()


def ctr_job(trainers: int, examples: int, share: float) -> TrainConfig:
    return TrainConfig(trainers=trainers, workers=1, embedding_servers=1, examples=examples,
                       switch_plan=f"bsp:{share:g},asp", eval_points=6, progress=False,
                       log_every=10**12).validate()


def run_job(cfg: TrainConfig, out: Path, metric: str) -> dict[str, Any]:
    from shadowsync.api import run

    if out.exists():
        shutil.rmtree(out)
    _, s = run(replace(cfg, out=str(out)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["wall_s"], r[f"eval_{metric}"]) for r in rows
             if r.get("trainer") == 0 and r.get(f"eval_{metric}") is not None]
    switches = s.get("switches", [])
    return {"train_s": s["train_s"], "metric": s[f"eval_{metric}"], "examples": s["examples"],
            "curve": curve, "switches": len(switches),
            "switch_cost_s": [w["cost_s"] for w in switches],
            "params_identical": all(w["params_identical"] for w in switches
                                    if w["from"] == "bsp"),
            "staleness_mean": s.get("staleness", {}).get("staleness_mean")}


def time_to(curve: list[tuple[float, float]], target: float, higher: bool) -> float | None:
    for t, v in curve:
        if (v >= target) if higher else (v <= target):
            return t
    return None


def bench_task(root: Path, task: str, base: TrainConfig, repeats: int) -> dict[str, Any]:
    metric = "accuracy" if task == "digits" else "ne"
    higher = task == "digits"
    target = DIGITS_TARGET if higher else CTR_TARGET_NE
    counter = iter(range(10**6))
    window: dict[str, str] = {}

    def go(protocol: str, straggler: bool) -> Any:
        def run() -> dict[str, Any]:
            cfg = replace(base, sync=protocol, straggler=window["spec"] if straggler else None)
            name = f"{protocol}{'-straggler' if straggler else ''}-{next(counter)}"
            r = run_job(cfg, root / task / name, metric)
            if protocol == "bsp" and not straggler and "spec" not in window:
                t = r["train_s"]  # the middle half of the straggler-free BSP run
                window["spec"] = f"trainer=1,slowdown=3,start={t / 4:.2f},duration={t / 2:.2f}"
            r["time_to_target_s"] = time_to(r["curve"], target, higher)
            return r
        return run

    variants = {p: go(p, False) for p in PROTOCOLS}  # bsp first: it places the window
    variants.update({f"{p}+straggler": go(p, True) for p in PROTOCOLS})
    runs = interleaved(variants, repeats, f"bench switch: {task}")
    med = {v: {k: median_of(runs, v, k) for k in ("train_s", "metric", "time_to_target_s")}
           for v in variants}
    costs = [c for r in runs for c in r["switch_cost_s"]]
    return {"runs": runs, "medians": med, "metric": metric, "target": target,
            "straggler": window.get("spec"),
            "switch_overhead_s": statistics.mean(costs) if costs else None,
            "params_identical_at_every_switch": all(r["params_identical"] for r in runs)}


def ratios_of(res: dict[str, Any], suffix: str) -> dict[str, float | None]:
    m = res["medians"]

    def t(v: str) -> float:
        return m[v]["train_s"]

    def q(v: str) -> float:
        return m[v]["metric"]

    if res["metric"] == "accuracy":  # differences in accuracy points
        def d(a: str, b: str) -> float:
            return 100.0 * (q(a) - q(b))
        names = ("acc_minus_bsp", d)
    else:  # NE ratios (lower is better)
        def d(a: str, b: str) -> float:
            return q(a) / q(b)
        names = ("ne_vs_bsp", d)
    key, f = names
    return {
        f"switch_time_vs_bsp{suffix}": t("switch") / t("bsp"),
        f"switch_{key}{suffix}": f("switch", "bsp"),
        f"asp_{key}{suffix}": f("asp", "bsp"),
        f"asp_time_vs_bsp{suffix}": t("asp") / t("bsp"),
        f"switch_time_vs_bsp_straggler{suffix}": t("switch+straggler") / t("bsp+straggler"),
        f"switch_{key}_straggler{suffix}": f("switch+straggler", "bsp+straggler"),
        f"switch_overhead_s{suffix}": res["switch_overhead_s"],
    }


def run_switch_bench(out: str, trainers: int = 4, digits_examples: int = 24_000,
                     ctr_examples: int = 300_000, share: float = 0.25, repeats: int = 3,
                     ctr: bool = True) -> dict[str, Any]:
    root = Path(out)
    results = {"digits": bench_task(root, "digits",
                                    digits_job(trainers, digits_examples, share), repeats)}
    ratios = ratios_of(results["digits"], "")
    if ctr:
        results["ctr"] = bench_task(root, "ctr", ctr_job(trainers, ctr_examples, share), repeats)
        ratios.update(ratios_of(results["ctr"], "_ctr"))
    runs = [{"task": task, **r} for task, res in results.items() for r in res["runs"]]
    extra = {"trainers": trainers, "share": share, "repeats": repeats,
             "digits_lr": DIGITS_LR, "digits_examples": digits_examples,
             **({"ctr_examples": ctr_examples} if ctr else {}),
             "medians": {t: r["medians"] for t, r in results.items()},
             "straggler": {t: r["straggler"] for t, r in results.items()},
             "params_identical_at_every_switch": all(
                 r["params_identical_at_every_switch"] for r in results.values())}
    for task, res in results.items():
        print(f"\n{task}: eval {res['metric']} (median of {repeats})")
        print_table([[v, m["train_s"], m["metric"], m["time_to_target_s"]]
                     for v, m in res["medians"].items()],
                    ["variant", "train s", res["metric"], f"s to {res['target']}"])
    print()
    print_table([[k, v if v is not None else "n/a"] for k, v in ratios.items()],
                ["ratio", "value"])
    path = write_bench(root, "switch", runs, ratios, extra)
    plot_switch_bench(root, results)
    print(f"wrote {path}")
    return {"ratios": ratios, **extra}


def plot_switch_bench(root: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 4.2 * len(results)), squeeze=False)
    colors = {"bsp": "tab:blue", "asp": "tab:orange", "switch": "tab:green"}
    for row, (task, res) in enumerate(results.items()):
        for col, straggler in enumerate((False, True)):
            ax = axes[row][col]
            for p in PROTOCOLS:
                v = f"{p}+straggler" if straggler else p
                first = next((r for r in res["runs"] if r["variant"] == v and r["curve"]), None)
                if first:
                    ax.plot(*zip(*first["curve"]), "o-", color=colors[p], label=p)
            ax.set_xlabel("wall time since trainer 0 started (s)")
            ax.set_ylabel(f"eval {res['metric']}")
            when = "one trainer 3x slower mid-run" if straggler else "no straggler"
            ax.set_title(f"{task}, {when}")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(root / "switch.png", dpi=110)
    plt.close(fig)
