"""`shadowsync bench switch`: BSP, ASP and Sync-Switch side by side, with and without a
slowdown (Li, Mangoubi, Xu, Guo, "Sync-Switch", ICDCS 2021, arXiv 2104.08364).

Every protocol trains the same job for the same total examples (a budget of gradients counted
on the dense servers). The compute straggler is one trainer 3x slower for the middle half of
the run: from a quarter of the job's examples to three quarters (`STRAGGLER`), so every
protocol meets it over the same work whatever its pace; the network ones (`SCENARIOS`) delay
pushes over the same window, or jitter every push all along. Variants run interleaved,
repeated; medians are compared. Repeat r of every variant runs with seed r (its initial
weights, data order and, on digits, its held-out images), so the medians are over seeds and
each repeat is a paired comparison on the same data. Times are training times (first step to
last), so process start-up, the same for all, is left out.

The default run keeps what the goals need (digits: bsp, asp, switch, bsp and greedy under the
straggler, and bsp, greedy and isolate behind a 30 ms link on one trainer; ctr the first five
at 100k examples); `--full` runs instead only what the delay and false-alarm goals need
(`FULL_VARIANTS`, digits at 48k examples): BSP and ASP, then BSP, greedy, elastic and isolate
(beyond the paper: only the straggler asynchronous) behind each delayed link (`DELAYS`: 10
and 30 ms, on one and on two trainers, in one episode and in four; each also reported as the
slowdown of a step, `step_slowdown_*`, and of BSP's run, `bsp_slowdown_*`), and greedy and
elastic under a false alarm (`FALSE_ALARM`); `--variants` picks any other digits variants
(DDP, the policies under the compute straggler, a jittered network, the configuration
ablation, `ABLATION`). `--full`'s ASP steps run with momentum compensation
(`FULL_COMPENSATE`: its short job's ASP phases were at the instability edge). `--slow-link
MBIT` adds the straggler as a slow network link instead of slow compute, over the same window
(`bench_slow_link`). The goals (`GOALS`) are printed met / not met beside the ratios, with
each online policy's bound computed from the run's own BSP and ASP times and the steps its
detector needs to see a slowdown (`greedy_bound`, `detection_lag_share`), and the switch
overhead as the paper counts it: the share of the run's time spent switching.

Accuracy on digits is over 300 held-out images a seed, so a median over the seeds moves in
steps of 0.33 points, two images being 0.67. Isolate against greedy, the one goal that
compares two policies' accuracies, is taken over every held-out image of the repeats
instead (`pooled`: each seed holds out its own 300, 900 images at 3 repeats, 0.11 points an
image), its goal as the issue states it (isolate at least as accurate), with the difference's
standard error (`accuracy_gap_se`, about 0.7 points) printed beside it: a gap smaller than
that is not a measured one. Eval losses are reported beside
it, against greedy's and BSP's: a model that fits its training images exactly (training
loss near 0, as BSP and isolate do here) is surer of the few images it gets wrong, so a
lower eval loss can mean a looser fit, not a better model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from shadowsync.bench.common import Job, job_cpu_s, write_bench
from shadowsync.bench.switch.ratios import ratio_spreads, ratios_of
from shadowsync.bench.switch.report import (
    plot_switch_bench,
    print_costs,
    print_goals,
    print_slow_link,
    print_task,
)
from shadowsync.bench.switch.runs import bench_task, time_split
from shadowsync.bench.switch.scenarios import (
    CTR_EXAMPLES,
    CTR_SHARE,
    CTR_VARIANTS,
    DELAYS,
    DIGITS_EXAMPLES,
    DIGITS_LR,
    DIGITS_SHARE,
    FULL_COMPENSATE,
    FULL_DIGITS_EXAMPLES,
    VARIANTS,
    ctr_job,
    digits_job,
    digits_variants,
)
from shadowsync.bench.switch.slow_link import bench_slow_link, slow_link_ratios
from shadowsync.transport.delay import link_kind

# Each task's ratios are named with its suffix (digits, the goals' task, with none).
SUFFIX = {"digits": "", "ctr": "_ctr"}


def run_switch_bench(out: str, trainers: int = 4, digits_examples: int | None = None,
                     ctr_examples: int | None = None, share: float = DIGITS_SHARE,
                     repeats: int = 3, ctr: bool = True, ctr_trainers: int = 2,
                     ctr_share: float = CTR_SHARE, digits: bool = True,
                     full: bool = False, slow_link: float | None = None,
                     variants: tuple[str, ...] | None = None,
                     digits_lr: float | None = None) -> dict[str, Any]:
    """`variants`: run these on digits instead of the default's (or --full's); the
    baselines their ratios need are added."""
    root = Path(out)
    started, cpu0 = time.perf_counter(), job_cpu_s()
    ctr_examples = CTR_EXAMPLES if ctr_examples is None else ctr_examples
    if digits_examples is None:
        digits_examples = FULL_DIGITS_EXAMPLES if full else DIGITS_EXAMPLES
    digits_lr = DIGITS_LR if digits_lr is None else digits_lr
    compensate = full and FULL_COMPENSATE
    results: dict[str, Any] = {}
    if digits:
        digits_runs = Job(root / "digits", digits_job(trainers, digits_examples, share,
                                                      digits_lr, compensate))
        results["digits"] = bench_task(digits_runs, "digits", repeats,
                                       digits_variants(full, variants))
    if ctr:
        ctr_runs = Job(root / "ctr", ctr_job(ctr_trainers, ctr_examples, ctr_share))
        results["ctr"] = bench_task(ctr_runs, "ctr", repeats, CTR_VARIANTS)
    ratios = {k: v for task, res in results.items()
              for k, v in ratios_of(res, SUFFIX[task]).items()}
    spreads = {k: v for task, res in results.items()  # each ratio's [min, max] seed by seed
               for k, v in ratio_spreads(res, SUFFIX[task]).items()}
    link = None
    if slow_link is not None:  # on digits, after the rest
        link = bench_slow_link(
            Job(root / "slow-link", digits_job(trainers, digits_examples, share, digits_lr,
                                               compensate)), repeats, slow_link)
        ratios.update(slow_link_ratios(link))
    runs = [{"task": task, **r} for task, res in results.items() for r in res["runs"]]
    extra = {**({"slow_link": link} if link is not None else {}),
             **({"delayed_link": link_kind()} if _delayed(results) else {}),
             "bench_wall_s": time.perf_counter() - started, "bench_cpu_s": job_cpu_s() - cpu0,
             "time_split": {t: time_split(res["runs"]) for t, res in results.items()},
             "trainers": trainers, "share": share, "repeats": repeats, "full": full,
             "seeds": "repeat r of every variant: seed r",
             **({"digits_lr": digits_lr, "digits_examples": digits_examples,
                 "asp_momentum_compensated": compensate} if digits else {}),
             **({"ctr_examples": ctr_examples, "ctr_trainers": ctr_trainers,
                 "ctr_share": ctr_share} if ctr else {}),
             **_per_task(results)}
    for task, res in results.items():
        print_task(task, res, repeats)
    if link is not None and "medians" in link:
        print_slow_link(link, repeats)
    extra["goals"] = print_goals(ratios, spreads)
    extra["ratio_spread"] = spreads
    print_costs(ratios, extra)
    path = write_bench(root, "switch", runs, ratios, extra)
    if results:  # not with --slow-link alone
        plot_switch_bench(root, results)
    print(f"wrote {path}")
    return {"ratios": ratios, **extra}


def _delayed(results: dict[str, Any]) -> bool:
    """Whether any task ran a variant behind a delayed link."""
    return any(VARIANTS[v].scenario in DELAYS for res in results.values()
               for v in res["medians"])


def _per_task(results: dict[str, Any]) -> dict[str, Any]:
    """What bench.json keeps of each task beside its runs."""
    return {"medians": {t: r["medians"] for t, r in results.items()},
            "spreads": {t: r["spreads"] for t, r in results.items()},
            "paired": {t: r["paired"] for t, r in results.items()},
            "paired_with_greedy": {t: r["paired_with_greedy"] for t, r in results.items()},
            "switches": {t: r["switches"] for t, r in results.items()},
            "diverged": {t: r["diverged"] for t, r in results.items()},
            "straggler": {t: r["straggler"] for t, r in results.items()},
            "switch_overhead_max_s": {t: r["switch_overhead_max_s"]
                                      for t, r in results.items()},
            "params_identical_at_every_switch": all(
                r["params_identical_at_every_switch"] for r in results.values())}
