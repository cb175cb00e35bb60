"""What `bench switch` prints and plots: each task's medians and paired ratios, isolate's
phases, the slow link's runs, the goals met or not, and the eval curves (switch.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from shadowsync.bench.common import print_table
from shadowsync.bench.switch.goals import GOALS, goal_met, goal_text
from shadowsync.bench.switch.runs import CHANCE
from shadowsync.bench.switch.scenarios import (
    DELAYS,
    FALSE_ALARM,
    FALSE_ALARM_SLOWDOWN,
    FALSE_ALARM_STEPS,
    JITTER_J_MS,
    JITTER_MS,
    SCENARIOS,
    SLOWDOWN,
)
from shadowsync.protocols import Protocol


def phases_text(phases: list[dict[str, Any]]) -> str:
    """'bsp, bsp isolating [2] at 270, bsp at 611 (released [2]), asp at 1014'."""
    out, before = [], set()
    for i, p in enumerate(phases):
        now = set(p["isolated"])
        text = p["to"] + (f" isolating {sorted(now)}" if now else "")
        if i:
            text += f" at {p['applied']}"
        released = sorted(before - now) if p["to"] == Protocol.BSP else []
        out.append(text + (f" (released {released})" if released else ""))
        before = now
    return ", ".join(out)


def range_text(r: list[float] | None) -> str:
    return "n/a" if r is None else f"{r[0]:.3f}-{r[1]:.3f}"


def plot_switch_bench(root: Path, results: dict[str, Any]) -> None:
    columns = [None, *SCENARIOS]  # one panel per slowdown that ran
    columns = [c for c in columns if any(v.partition("+")[2] == (c or "")
                                         for res in results.values() for v in res["medians"])]
    fig = Figure(figsize=(6 * len(columns), 4.2 * len(results)))
    axes = fig.subplots(len(results), len(columns), squeeze=False)
    colors = {"bsp": "tab:blue", "ddp": "tab:purple", "asp": "tab:orange",
              "switch": "tab:green", "greedy": "tab:red", "elastic": "tab:brown",
              "isolate": "tab:pink"}
    titles = {None: "no slowdown", "straggler": f"one trainer {SLOWDOWN:g}x slower mid-run",
              **{name: s.title for name, s in DELAYS.items()},
              "jitter": f"{JITTER_MS:g} +- {JITTER_J_MS:g} ms on every push",
              FALSE_ALARM: f"a false alarm: trainer 1 {FALSE_ALARM_SLOWDOWN:g}x slower for "
                           f"{FALSE_ALARM_STEPS} steps"}
    for row, (task, res) in enumerate(results.items()):
        for col, scenario in enumerate(columns):
            ax = axes[row][col]
            for v in res["medians"]:
                p, _, sc = v.partition("+")
                if sc != (scenario or ""):
                    continue
                first = next((r for r in res["runs"] if r["variant"] == v and r["curve"]), None)
                if first:
                    ax.plot(*zip(*first["curve"]), "o-", color=colors.get(p), label=p)
            ax.set_xlabel("wall time since trainer 0 started (s)")
            ax.set_ylabel(f"eval {res['metric']}")
            ax.set_title(f"{task}, {titles[scenario]}")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # a scenario none of this run's variants ran
                ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(root / "switch.png", dpi=110)


def print_task(task: str, res: dict[str, Any], repeats: int) -> None:
    """A task's medians and spreads, isolate's phases run by run, and the paired ratios."""
    print(f"\n{task}: eval {res['metric']}, median [min, max] of {repeats}")
    print_table([[v, m["train_s"], range_text(res["spreads"][v]["train_s"]), m["metric"],
                  range_text(res["spreads"][v]["metric"]), m["time_to_target_s"],
                  res["switches"][v], res["diverged"][v] or ""]
                 for v, m in res["medians"].items()],
                ["variant", "train s", "range", res["metric"], "range",
                 f"s to {res['target']}", "switches", "diverged"])
    if any(res["diverged"].values()):
        print(f"a diverged run scores chance ({res['metric']} {CHANCE[res['metric']]:g}) "
              "and has no time; its variant's time is the median of the others")
    isolating = [r for r in res["runs"] if r["variant"].startswith("isolate")]
    if isolating:
        print("isolate's phases, run by run (gradients applied when each was decided):")
        for r in isolating:
            print(f"  {r['variant']} seed {r['seed']}: {phases_text(r['phases'])}")
    print("paired, repeat by repeat (same seed): median [min, max]")
    unit = "points" if res["metric"] == "accuracy" else "ratio"
    pairs = [*res["paired"].items(), *res["paired_with_greedy"].items()]
    print_table([[v, p["vs"], p["metric"].get("median"), range_text(p["metric"].get("range")),
                  p["time"].get("median"), range_text(p["time"].get("range"))]
                 for v, p in pairs],
                ["variant", "vs", f"{res['metric']} {unit}", "range", "time ratio",
                 "range"])


def print_slow_link(link: dict[str, Any], repeats: int) -> None:
    print(f"\nslow link ({link['mbit']:g} Mbit/s between trainer 1 and the dense server), "
          f"digits: median [min, max] of {repeats}")
    print_table([[v, m["train_s"], range_text(link["spreads"][v]["train_s"]), m["metric"],
                  range_text(link["spreads"][v]["metric"]), link["switches"][v]]
                 for v, m in link["medians"].items()],
                ["variant", "train s", "range", "accuracy", "range", "switches"])


def print_goals(ratios: dict[str, float | None],
                spreads: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """The ratios, seed-by-seed spreads and goals met or not; the goals' record."""
    print()
    met = {k: goal_met(k, ratios) for k in ratios}
    print_table([[k, v if v is not None else "n/a", range_text(spreads.get(k)), goal_text(k),
                  {True: "met", False: "NOT MET", None: ""}[met[k]]]
                 for k, v in ratios.items()],
                ["ratio", "value", "seed by seed", "goal", ""])
    return {k: {"goal": goal_text(k), "value": ratios[k], "met": met[k]}
            for k in ratios if k in GOALS}


def print_costs(ratios: dict[str, float | None], extra: dict[str, Any]) -> None:
    """The delayed links' kind, greedy's bounds, and where the bench's time went."""
    if "delayed_link" in extra:
        print(f"the delayed links: {extra['delayed_link']}")
    bounds = {k: v for k, v in ratios.items() if k.startswith("bound_s_")}
    if bounds:
        print("greedy's bound (`greedy_bound`, from this run's BSP and ASP times): " + ", ".join(
            f"{k.removeprefix('bound_s_')} {v:.2f} s" for k, v in bounds.items()))
    print(f"\nbench: {extra['bench_wall_s'] / 60:.1f} min wall, "
          f"{extra['bench_cpu_s'] / 60:.1f} CPU-min; per run (median): " + ", ".join(
              f"{t} {v['run_s_median']:.0f} s of which {v['startup_s_median']:.0f} s starting "
              f"and ending processes" for t, v in extra["time_split"].items()))
