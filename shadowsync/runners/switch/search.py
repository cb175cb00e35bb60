"""The offline timing policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364): for a recurring job, find the smallest BSP share that still reaches full BSP's
final metric, once, and reuse it (`--switch-at auto`).

The search runs the job at full BSP, then with the BSP share halving from 50% (50, 25, 12.5,
6.25 ... and `min_share` itself last, the floor, at least `MIN_SHARE_FLOOR` = 1%: the
paper's recurring jobs went down to 2-5% BSP), `seeds` runs per point, keeping the smallest
share whose mean final metric is within `tolerance` of full BSP's mean (accuracy points as
fractions, NE as a ratio - 1).

The tolerance, unless given, is BSP's own seed-to-seed spread (`spread_tolerance`):

    tolerance = max(x_i) - min(x_i)               (accuracy: absolute)
    tolerance = (max(x_i) - min(x_i)) / mean(x_i)  (NE: relative)

over full BSP's final metrics x_1..x_R. A share whose mean falls short of BSP's by less than
BSP's own runs differ among themselves is not told apart from BSP; it needs R >= 2. Once a
share misses, the smallest share that passes lies between it and the last share that passed;
the search bisects that bracket (the metric falls as the share does) until it has measured
`probes` points in all, full BSP included, and returns the smallest share that passed.
Halving alone could stop at twice the share the job needs; each probe left after the halving
halves the bracket (6 probes, a miss at 25%: 3 halvings, within 1/8 of it). This is the
paper's offline timing policy for recurring jobs (a binary search over the switch point).
The result is stored as `STORE/NAME.json`, with a plot of the metric against the share
beside it; `probes` keeps the order the points were measured in.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shadowsync.errors import UserError
from shadowsync.spec.share import BspShare

DEFAULT_STORE = "runs/switch-search"
DEFAULT_PROBES = 6  # points measured in all, full BSP included
MIN_SHARE_FLOOR = 0.01  # the smallest BSP share a search may try
DEFAULT_MIN_SHARE = MIN_SHARE_FLOOR

# run(share, seed) -> the run's final metric
RunFn = Callable[[float, int], float]


@dataclass
class SearchResult:
    name: str
    share: float  # the chosen BSP share
    metric: str
    higher_is_better: bool
    tolerance: float
    bsp_mean: float
    points: dict[str, list[float]] = field(default_factory=dict)  # share -> metrics
    wall_s: float | None = None  # what the search took
    probes: list[float] = field(default_factory=list)  # shares in the order measured
    bracket: list[float] | None = None  # [largest share that missed, smallest that passed]

    def mean(self, share: float) -> float:
        return statistics.fmean(self.points[f"{share:g}"])


def shares(min_share: float) -> list[float]:
    """50%, 25%, 12.5% ... while at least `min_share`, then `min_share` itself."""
    out, s = [], 0.5
    while s >= min_share - 1e-12:
        out.append(s)
        s /= 2
    if not out or out[-1] > min_share + 1e-12:
        out.append(min_share)
    return out


def spread_tolerance(bsp: list[float], higher_is_better: bool) -> float:
    """BSP's seed-to-seed spread, the default tolerance (see the module's rule)."""
    if len(bsp) < 2:
        raise UserError("switch search: the tolerance from BSP's seed-to-seed spread needs "
                        "--seeds >= 2 (or give --tolerance)")
    spread = max(bsp) - min(bsp)
    return spread if higher_is_better else spread / statistics.fmean(bsp)


def within(value: float, reference: float, tolerance: float, higher_is_better: bool) -> bool:
    if higher_is_better:
        return value >= reference - tolerance
    return value <= reference * (1.0 + tolerance)


def search(run: RunFn, name: str, metric: str, higher_is_better: bool,
           tolerance: float | None = None, seeds: int = 2,
           min_share: float = DEFAULT_MIN_SHARE, progress: Any = None,
           probes: int = DEFAULT_PROBES) -> SearchResult:
    """Find the share. `tolerance` None: BSP's spread. `progress(share)` is called before
    each point (a progress bar)."""
    points: dict[str, list[float]] = {}
    order: list[float] = []

    def passes(share: float) -> bool:
        if progress is not None:
            progress(share)
        points[f"{share:g}"] = [run(share, seed) for seed in range(seeds)]
        order.append(share)
        return within(statistics.fmean(points[f"{share:g}"]), bsp, tolerance,
                      higher_is_better)

    started = time.perf_counter()
    if progress is not None:
        progress(1.0)
    points["1"] = [run(1.0, seed) for seed in range(seeds)]
    order.append(1.0)
    bsp = statistics.fmean(points["1"])
    if tolerance is None:
        tolerance = spread_tolerance(points["1"], higher_is_better)
    best, missed = 1.0, None
    for share in shares(min_share):
        if len(order) >= probes:
            break
        if not passes(share):
            missed = share
            break
        best = share
    while missed is not None and len(order) < probes:
        mid = (missed + best) / 2
        if passes(mid):
            best = mid
        else:
            missed = mid
    return SearchResult(name, best, metric, higher_is_better, tolerance, bsp, points,
                        time.perf_counter() - started, order,
                        [missed, best] if missed is not None else None)


def store(result: SearchResult, root: str | Path = DEFAULT_STORE,
          name: str | None = None) -> Path:
    """`ROOT/NAME.json` and the plot beside it (`name`: another file name than the job's)."""
    path = Path(root) / f"{name or result.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=2) + "\n")
    plot(result, path.with_suffix(".png"))
    return path


def load(name: str, root: str | Path = DEFAULT_STORE) -> SearchResult:
    path = Path(root) / f"{name}.json"
    if not path.exists():
        raise UserError(f"--switch-at auto: no search result for job '{name}' ({path}); run "
                        f"`shadowsync switch search --config JOB.toml --name {name}` first")
    return SearchResult(**json.loads(path.read_text()))


def resolve_share(at: BspShare, job_name: str | None,
                  root: str | Path = DEFAULT_STORE) -> BspShare:
    """`--switch-at` with `auto` resolved to the share stored for `job_name` (read once, by the
    job's entry, before any process starts)."""
    if not at.auto or at.share is not None:
        return at
    if not job_name:
        raise UserError("--switch-at auto needs --job-name (the name `shadowsync switch "
                        "search` stored its result under)")
    return at.resolved(load(job_name, root).share)


def plot(result: SearchResult, path: Path) -> None:
    # Here, not at the top: matplotlib with pyplot takes about 1.7 s to import (measured),
    # and every switch job's entry imports this module (`resolve_share`) without plotting.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = sorted(float(k) for k in result.points)
    fig, ax = plt.subplots(figsize=(6, 4))
    for x in xs:
        ys = result.points[f"{x:g}"]
        ax.plot([x] * len(ys), ys, "o", color="tab:gray", alpha=0.5)
    ax.plot(xs, [result.mean(x) for x in xs], "o-", color="tab:blue", label="mean")
    ax.axvline(result.share, color="tab:green", ls="--", label=f"chosen {result.share:g}")
    ax.axhline(result.bsp_mean - result.tolerance if result.higher_is_better
               else result.bsp_mean * (1 + result.tolerance), color="tab:red", ls=":",
               label="tolerance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("BSP share of the job")
    ax.set_ylabel(f"final {result.metric}")
    ax.set_title(f"switch search: {result.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
