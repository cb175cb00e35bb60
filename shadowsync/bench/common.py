"""What every benchmark shares: the job it runs in variants, interleaved repeats, medians,
the bench.json shape, a table."""

from __future__ import annotations

import json
import resource
import shutil
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shadowsync import api, forkserver
from shadowsync.config import ClusterConfig, TrainConfig


@dataclass(eq=False)  # a job is itself, whatever its options
class Job:
    """The job a bench runs in variants: the options every run shares (`base`, a job of its
    own), each variant's configuration a copy with flat changes (`config`), each run in its
    own numbered directory under `root` (`out`; `counter` numbers them, and jobs may share
    one)."""

    root: Path
    base: TrainConfig
    counter: Iterator[int] = field(default_factory=lambda: iter(range(10**6)))

    def config(self, **changes: Any) -> TrainConfig:
        """The job's configuration with `changes` (flat option names)."""
        return replace(self.base, **changes)

    def out(self, name: str) -> Path:
        """A new directory name for a run of the variant `name`."""
        return self.root / f"{name.replace('+', '-').replace('/', '-')}-{next(self.counter)}"

    def run(self, out: Path, **changes: Any) -> dict[str, Any]:
        """Run the job with `changes` in `out` (emptied first) as the API does; its summary."""
        return run_job(self.config(**changes), out)


def run_job(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """Run the job `cfg` in `out` (emptied first) as the API does; returns its summary."""
    if out.exists():
        shutil.rmtree(out)
    _, summary = api.run(replace(cfg, out=str(out)))
    return summary


def interleaved(variants: dict[str, Callable[[], dict[str, Any]]], repeats: int,
                desc: str, log: Path | None = None) -> list[dict[str, Any]]:
    """Run every variant once per repeat, in turn, so machine noise hits all of them alike;
    who goes first rotates from repeat to repeat, so that neither is always the one after
    the other. With `log`, each run is also appended to that JSON-lines file as it ends (a
    long bench that is stopped keeps what it measured)."""
    runs: list[dict[str, Any]] = []
    names = list(variants)
    with tqdm(total=repeats * len(variants), desc=desc, unit="run") as bar:
        for r in range(repeats):
            for name in rotated(names, r):
                result = variants[name]()
                runs.append({"variant": name, "repeat": r, **result})
                if log is not None:
                    log.parent.mkdir(parents=True, exist_ok=True)
                    with log.open("a", encoding="utf-8") as fh:
                        fh.write(json.dumps(runs[-1]) + "\n")
                bar.update(1)
    return runs


def rotated(names: list[str], turn: int) -> list[str]:
    """`names` with the one at `turn` (modulo their number) first: who goes first at that
    turn, each in turn."""
    k = turn % len(names)
    return names[k:] + names[:k]


def job_cpu_s() -> float:
    """CPU seconds of this process and of the finished processes it started (the runs),
    those forked by the fork server included."""
    return forkserver.cpu_s() + sum(
        resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def median_of(runs: list[dict[str, Any]], variant: str, key: str) -> float:
    values = [r[key] for r in runs if r["variant"] == variant and r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def per_repeat(runs: list[dict[str, Any]], variant: str, key: str) -> dict[int, float]:
    return {r["repeat"]: r[key] for r in runs
            if r["variant"] == variant and r.get(key) is not None}


def ratio_of_medians(runs: list[dict[str, Any]], num: str, den: str | float,
                     key: str, den_key: str | None = None) -> tuple[float | None, list[float]]:
    """median(num) / median(den), and the spread: [min, max] of the ratio taken repeat by
    repeat (variants run interleaved, so repeat r of both ran side by side). `den` may be a
    constant."""
    a = per_repeat(runs, num, key)
    b = ({r: float(den) for r in a} if not isinstance(den, str)
         else per_repeat(runs, den, den_key or key))
    common = sorted(set(a) & set(b))
    if not common or not all(b[r] for r in common):
        return None, []
    each = [a[r] / b[r] for r in common]
    med = statistics.median(a.values()) / statistics.median(b.values())
    return med, [min(each), max(each)]


def write_bench(out: Path, name: str, runs: list[dict[str, Any]], ratios: dict[str, float],
                extra: dict[str, Any] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    path.write_text(json.dumps({"bench": name, "runs": runs, "ratios": ratios, **(extra or {})},
                               indent=2) + "\n", encoding="utf-8")
    return path


def print_table(rows: list[list[Any]], header: list[str]) -> None:
    cells = [[_fmt(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in
                        enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"
    return str(v)


def torch_period(ma_run: dict[str, Any], cluster: ClusterConfig, batch_size: int) -> int:
    """Steps between PyTorch averaging rounds that match s-ma's syncs per minute (`batch_size`:
    examples a worker step)."""
    steps_per_min = ma_run["eps"] / cluster.trainers / cluster.workers / batch_size * 60
    rate = ma_run.get("syncs_per_min") or 1.0
    return max(1, round(steps_per_min / rate))
