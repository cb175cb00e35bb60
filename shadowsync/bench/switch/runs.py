"""One run of `bench switch` and a task's interleaved repeats of its variants: the run's
times and metric, what its switches cost and which phases it went through, and the medians,
spreads and pairings of the repeats."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowsync.bench import common
from shadowsync.bench.common import Job, interleaved, median_of
from shadowsync.bench.switch.ratios import paired
from shadowsync.bench.switch.scenarios import (
    CTR_TARGET_NE,
    DIGITS_TARGET,
    SCENARIOS,
    STRAGGLER,
    VARIANTS,
    compared_with,
    isolates,
    scenario_text,
    settings_of,
)
from shadowsync.lifecycle.exits import TrainingDiverged
from shadowsync.protocols import Protocol
from shadowsync.train.tasks import task_of

# What a diverged run scores: chance. Digits has 10 balanced classes; an NE of 1.0 is the
# constant prediction of the base rate (`shadowsync.metrics.ctr`).
CHANCE = {"accuracy": 0.1, "ne": 1.0}


def measured_run(train: Callable[[], dict[str, Any]], out: Path, metric: str) -> dict[str, Any]:
    """One run (`train()`, which returns its summary and writes its metrics in `out`), timed
    whole (`run_s`: launch to summary) and in training (`train_s`); the difference,
    `startup_s`, is starting and ending the processes. The bench's jobs write
    no checkpoint (`--checkpoint-every never`): nothing here reads one, and a ctr run's would
    hold the 26 tables, about 170 MB.

    A run that diverges is a result, not the bench's end (an ablation such as ASP without
    the rate scaling is expected to): it scores chance (`CHANCE`), has no training time,
    and is marked `diverged` with the error's line."""
    t0 = time.perf_counter()
    try:
        s = train()
    except TrainingDiverged as e:
        return {"train_s": None, "run_s": time.perf_counter() - t0, "startup_s": None,
                "metric": CHANCE[metric], "loss": None, "train_loss": None,
                "eval_examples": None, "examples": None, "curve": [],
                **switch_fields({}),
                "staleness_mean": None, "diverged": str(e)}
    run_s = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["wall_s"], r[f"eval_{metric}"]) for r in rows
             if r.get("trainer") == 0 and r.get(f"eval_{metric}") is not None]
    fit = [r["train_loss"] for r in rows if r.get("trainer") == 0 and "train_loss" in r]
    return {"train_s": s["train_s"], "run_s": run_s, "startup_s": run_s - s["train_s"],
            "metric": s[f"eval_{metric}"], "loss": s.get("eval_loss"),
            "train_loss": fit[-1] if fit else None, "eval_examples": s.get("eval_examples"),
            "examples": s["examples"], "curve": curve,
            **switch_fields(s), "staleness_mean": s.get("staleness", {}).get("staleness_mean"),
            "diverged": None}


def switch_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """What a run's summary says of its switches: how many, their costs, at which steps,
    whether parameters were identical across each, the stragglers an online policy saw, and
    how many times it left BSP for one (`straggler_switches`)."""
    switches = summary.get("switches", [])
    overhead = summary.get("switch_overhead") or {}
    return {"switches": len(switches), "switch_cost_s": [w["cost_s"] for w in switches],
            "switch_s": overhead.get("switch_s", []),
            "switch_share": overhead.get("share_of_run") if switches else None,
            "switch_steps": [w.get("step") for w in switches],
            "params_identical": all(w["params_identical"] for w in switches),
            "stragglers_seen": sorted({t for w in switches for t in w.get("stragglers", [])}),
            "straggler_switches": sum(1 for w in switches
                                      if w.get("to") == Protocol.ASP and w.get("stragglers")),
            **isolate_phases(switches)}


def isolate_phases(switches: list[dict[str, Any]]) -> dict[str, Any]:
    """The phases a run went through, from its summary's switches (`phases`: each one's
    protocol, who was isolated, and the gradients applied when it was decided; the first
    from 0), and each isolation (`isolations`: the trainer, the gradients applied when it
    was isolated, when it was released back into BSP, None if never, and when its isolation
    ended, by a release or by the plan's ASP phase)."""
    if not switches:
        return {"phases": [], "isolations": []}
    phases = [{"to": switches[0].get("from"), "isolated": [], "applied": 0}]
    isolations: list[dict[str, Any]] = []
    ongoing: dict[int, dict[str, Any]] = {}
    for w in switches:
        now = set(w.get("isolated", []))
        phases.append({"to": w.get("to"), "isolated": sorted(now), "applied": w.get("applied")})
        for t in sorted(now - ongoing.keys()):
            ongoing[t] = {"trainer": t, "isolated_at": w.get("applied"), "released_at": None,
                          "ended_at": None}
            isolations.append(ongoing[t])
        for t in sorted(ongoing.keys() - now):
            done = ongoing.pop(t)
            done["ended_at"] = w.get("applied")
            if w.get("to") == Protocol.BSP:
                done["released_at"] = w.get("applied")
    return {"phases": phases, "isolations": isolations}


def time_to(curve: list[tuple[float, float]], target: float, higher: bool) -> float | None:
    for t, v in curve:
        if (v >= target) if higher else (v <= target):
            return t
    return None


def spread(runs: list[dict[str, Any]], variant: str, key: str) -> list[float] | None:
    """[min, max] over the repeats."""
    values = [r[key] for r in runs if r["variant"] == variant and r.get(key) is not None]
    return [min(values), max(values)] if values else None


def bench_task(job: Job, task: str, repeats: int, names: tuple[str, ...]) -> dict[str, Any]:
    """The variants `names` of the task's job, interleaved, repeat r at seed r (each run
    under `job.root`)."""
    metric, higher = task_of(task).metric, task_of(task).higher_is_better
    target = DIGITS_TARGET if higher else CTR_TARGET_NE
    base = job.base
    seeds: dict[str, int] = {}
    steps = base.data.examples // base.optim.batch_size // (base.cluster.trainers
                                                           * base.cluster.workers)

    def go(variant: str) -> Any:
        v = VARIANTS[variant]

        def run() -> dict[str, Any]:
            seed = seeds[variant] = seeds.get(variant, -1) + 1  # repeat r: seed r
            cfg = job.config(sync=v.sync, switch_policy=v.policy, seed=base.seed + seed,
                             straggler=scenario_text(v.scenario, steps) if v.scenario else None,
                             **settings_of(v, base.switch.plan))
            out = job.out(variant)
            r = measured_run(lambda: common.run_job(cfg, out), out, metric)
            r["seed"] = cfg.seed
            r["time_to_target_s"] = time_to(r["curve"], target, higher)
            return r
        return run

    variants = {v: go(v) for v in names}
    runs = interleaved(variants, repeats, f"bench switch: {task}")
    keys = ("train_s", "metric", "time_to_target_s", "loss", "train_loss",
            "straggler_switches")
    med = {v: {k: median_of(runs, v, k) for k in keys} | pooled(runs, v) for v in variants}
    spreads = {v: {k: spread(runs, v, k) for k in keys} for v in variants}
    costs = [c for r in runs for c in r["switch_cost_s"]]
    by_variant = overhead_by_variant(runs)
    shares = [r["switch_share"] for r in runs if r.get("switch_share") is not None]
    return {"runs": runs, "medians": med, "spreads": spreads, "metric": metric,
            "paired": {v: paired(runs, v, compared_with(v), metric) for v in variants
                       if v != compared_with(v)},
            "paired_with_greedy": {v: paired(runs, v, f"greedy+{sc}", metric)
                                               for v in variants for sc in [VARIANTS[v].scenario]
                                   if isolates(VARIANTS[v].policy) and f"greedy+{sc}" in variants},
            "target": target, "straggler": STRAGGLER, "scenarios": SCENARIOS,
            "gradients": base.data.examples // base.optim.batch_size,
            "workers": base.cluster.trainers * base.cluster.workers,
            "bsp_share": base.switch.plan.share_of("bsp"),
            "switch_overhead_s": statistics.mean(costs) if costs else None,
            "switch_overhead_max_s": max(costs) if costs else None,
            "switch_overhead_share": max(by_variant.values()) if by_variant else None,
            "switch_overhead_share_by_variant": by_variant,
            "switch_overhead_share_max": max(shares) if shares else None,
            "switches": {v: median_of(runs, v, "switches") for v in variants},
            "diverged": {v: sum(1 for r in runs if r["variant"] == v and r.get("diverged"))
                         for v in variants},
            "params_identical_at_every_switch": all(r["params_identical"] for r in runs)}


def pooled(runs: list[dict[str, Any]], variant: str) -> dict[str, float]:
    """The metric over every held-out example of a variant's repeats (`metric_mean`, each
    repeat weighted by its examples; digits: each seed holds out its own 300 images, so 3
    repeats judge 900) and how many that is (`eval_n`): where a median over the seeds moves
    in steps of one image in 300, this resolves one in 900."""
    done = [r for r in runs if r["variant"] == variant and r.get("eval_examples")]
    n = sum(r["eval_examples"] for r in done)
    if not n:
        return {}
    return {"metric_mean": sum(r["metric"] * r["eval_examples"] for r in done) / n,
            "eval_n": n}


def overhead_by_variant(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The share of a run's time spent switching, median per variant that switched; the goal
    is on the largest (an online policy's many switches, not a plan's single one)."""
    shares: dict[str, list[float]] = {}
    for r in runs:
        if r.get("switch_share") is not None:
            shares.setdefault(r["variant"], []).append(r["switch_share"])
    return {v: statistics.median(x) for v, x in shares.items()}


def time_split(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a task's share of the bench went: its runs, their total and median whole-run
    time, and how much of it was training (the rest: starting and ending processes)."""
    whole = [r["run_s"] for r in runs]
    done = [r for r in runs if r["train_s"] is not None]  # not a diverged run
    return {"runs": len(runs), "run_s_total": sum(whole),
            "train_s_total": sum(r["train_s"] for r in done),
            "run_s_median": statistics.median(whole),
            "startup_s_median": statistics.median(r["startup_s"] for r in done)
            if done else None}
