"""Each variant against BSP under the same slowdown, and isolate against greedy: time ratios
and accuracy differences (points) or NE ratios, of the medians and repeat by repeat."""

from __future__ import annotations

import math
import statistics
from typing import Any

from shadowsync.bench.switch.bounds import bounds_of
from shadowsync.bench.switch.scenarios import DELAYS, FALSE_ALARM, VARIANTS, compared_with
from shadowsync.spec.modes import mode_of


def paired(runs: list[dict[str, Any]], variant: str, base: str,
           metric: str) -> dict[str, Any]:
    """Repeat by repeat (same seed, run side by side): the metric's difference (accuracy,
    points) or ratio (NE) and the time ratio, each as median and [min, max]."""
    a = {r["repeat"]: r for r in runs if r["variant"] == variant}
    b = {r["repeat"]: r for r in runs if r["variant"] == base}
    common = sorted(set(a) & set(b))

    def summary(values: list[float]) -> dict[str, Any]:
        return {"median": statistics.median(values), "range": [min(values), max(values)],
                "each": values} if values else {}

    q = [100.0 * (a[r]["metric"] - b[r]["metric"]) if metric == "accuracy"
         else a[r]["metric"] / b[r]["metric"] for r in common]
    t = [a[r]["train_s"] / b[r]["train_s"] for r in common  # a diverged run has no time
         if a[r]["train_s"] is not None and b[r]["train_s"]]
    return {"vs": base, "metric": summary(q), "time": summary(t)}


def ratio_names(variant: str, metric: str, suffix: str) -> tuple[str, str | None]:
    """The names of `variant`'s time ratio and metric difference against BSP (a mode off the
    dense servers' protocols, DDP, has no metric one: it is set beside BSP for time). Greedy
    under the compute straggler keeps its older names (`switch_..._straggler`); the offline
    plan under a slowdown is `offline_...`."""
    key = "acc_minus_bsp" if metric == "accuracy" else "ne_vs_bsp"
    on_servers = bool(mode_of(VARIANTS[variant].sync).protocols)
    policy, _, scenario = variant.partition("+")
    if variant == "greedy+straggler":
        policy = "switch"
    elif scenario:
        policy = {"switch": "offline"}.get(policy, policy)
    name = policy.replace("/", "_").replace("-", "_")
    tail = f"_{scenario}" if scenario else ""
    return (f"{name}_time_vs_bsp{tail}{suffix}",
            f"{name}_{key}{tail}{suffix}" if on_servers else None)


def ratio_spreads(res: dict[str, Any], suffix: str) -> dict[str, list[float]]:
    """[min, max] of each ratio against BSP (and of isolate's against greedy) taken repeat by
    repeat, seed against seed (`paired`): how far the seeds alone move a median."""
    out: dict[str, list[float]] = {}
    key = "acc_minus_greedy" if res["metric"] == "accuracy" else "ne_vs_greedy"
    for v, p in res["paired"].items():
        time_name, metric_name = ratio_names(v, res["metric"], suffix)
        if p["time"].get("range"):
            out[time_name] = p["time"]["range"]
        if metric_name and p["metric"].get("range"):
            out[metric_name] = p["metric"]["range"]
    for v, p in res.get("paired_with_greedy", {}).items():
        sc = v.partition("+")[2]
        if p["time"].get("range"):
            out[f"isolate_time_vs_greedy_{sc}{suffix}"] = p["time"]["range"]
        if p["metric"].get("range"):
            out[f"isolate_{key}_{sc}{suffix}"] = p["metric"]["range"]
    return out


def ratios_of(res: dict[str, Any], suffix: str) -> dict[str, float | None]:
    """Each variant against BSP under the same slowdown (`compared_with`): time ratio and
    accuracy difference (points) or NE ratio. Greedy under the compute straggler keeps its
    old names (`switch_..._straggler`); every online policy under a slowdown is also set
    against its bound (`greedy_bound`, from this task's BSP and ASP times)."""
    m = res["medians"]
    base = compared_with

    def t(v: str) -> float:
        return m[v]["train_s"] / m[base(v)]["train_s"]

    def q(v: str) -> float:
        b = base(v)
        if res["metric"] == "accuracy":  # differences in accuracy points
            return 100.0 * (m[v]["metric"] - m[b]["metric"])
        return m[v]["metric"] / m[b]["metric"]  # NE ratios (lower is better)

    key = "acc_minus_bsp" if res["metric"] == "accuracy" else "ne_vs_bsp"
    out: dict[str, float | None] = {}
    for v in m:
        if v.startswith("bsp") or base(v) not in m:
            continue
        time_name, metric_name = ratio_names(v, res["metric"], suffix)
        out[time_name] = t(v)
        if metric_name:
            out[metric_name] = q(v)
    for sc in DELAYS:  # isolate beside greedy under the same delay
        if f"isolate+{sc}" in m and f"greedy+{sc}" in m:
            iso, greedy = m[f"isolate+{sc}"], m[f"greedy+{sc}"]
            out[f"isolate_time_vs_greedy_{sc}{suffix}"] = iso["train_s"] / greedy["train_s"]
            gap = f"isolate_{key.replace('bsp', 'greedy')}_{sc}{suffix}"
            if res["metric"] != "accuracy":
                out[gap] = iso["metric"] / greedy["metric"]
            elif "eval_n" in iso and "eval_n" in greedy:  # over every held-out image
                out[gap] = 100.0 * (iso["metric_mean"] - greedy["metric_mean"])
                out[f"isolate_acc_tolerance_vs_greedy_{sc}{suffix}"] = -accuracy_gap_se(
                    iso, greedy)
            else:
                out[gap] = 100.0 * (iso["metric"] - greedy["metric"])
            # the eval loss, against greedy's and BSP's: it also rewards a model that fits
            # its training images less tightly (less confident on the few it gets wrong)
            for other in ("greedy", "bsp"):
                b = m.get(f"{other}+{sc}", {})
                if (iso.get("loss") or 0) > 0 and (b.get("loss") or 0) > 0:
                    out[f"isolate_loss_vs_{other}_{sc}{suffix}"] = iso["loss"] / b["loss"]
    for p in ("greedy", "elastic"):  # left BSP for the false alarm: median over the seeds
        if f"{p}+{FALSE_ALARM}" in m:
            out[f"{p}_false_alarm_switches{suffix}"] = m[f"{p}+{FALSE_ALARM}"][
                "straggler_switches"]
    if "switch+jitter" in m and "asp+jitter" in m:
        out[f"offline_time_vs_asp_jitter{suffix}"] = (m["switch+jitter"]["train_s"]
                                                     / m["asp+jitter"]["train_s"])
    out.update(bounds_of(res, suffix))
    out[f"switch_overhead_s{suffix}"] = res["switch_overhead_s"]
    out[f"switch_overhead_share{suffix}"] = res.get("switch_overhead_share")
    return out


def accuracy_gap_se(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The standard error, in points, of the difference of two pooled accuracies (`pooled`),
    each the share of N independent held-out images a model gets right (binomial):
        se = 100 sqrt(p_a (1 - p_a) / N_a + p_b (1 - p_b) / N_b)
    about 0.7 points at 98% over 900 images each."""
    return 100.0 * math.sqrt(sum(m["metric_mean"] * (1 - m["metric_mean"]) / m["eval_n"]
                                 for m in (a, b)))
