"""`shadowsync bench realdata`: real data, the default job beside tuned baselines, on splits
never used for choosing anything.

On each public set of `shadowsync data prepare` (MovieLens 100K as clicks, the adult census
income set, the clothing reviews; 90% / 10% splits, each a permutation drawn from a split
seed) the protocol is:

- **Split 0 is the tuning split.** Any default of the job may be chosen on it
  (`--tuning-split` runs the bench there); its figures are never the reported ones.
- **Splits 1-5 are the reported ones** (`--splits`, default 1; the whole protocol is
  `--splits 1-5`). Nothing is chosen by looking at them: the default job runs as it is.

On each reported split, for each seed, interleaved:

- **default**: the default job (2 trainers, one embedding server, s-bmuf) with only
  `--epochs` and `--val-share`: everything else is what --val-share adapts; its best
  checkpoint's eval AUC / NE;
- **local**: the same options with 1 trainer, local tables and `--sync none`;
- **deepfm**: a plain single-process PyTorch DeepFM (`shadowsync.bench.deepfm`), Adam at
  lr 1e-3, dropout 0.2, its best epoch on the same validation tail;
- **deepfm-tuned**: the same DeepFM at the grid point of DEEPFM_GRID (lr in {3e-4, 1e-3,
  3e-3} x dropout in {0, 0.2, 0.5}: 9 points) with the highest validation AUC, each point
  trained once with the first seed on this split's training rows;
- **lightgbm**: gradient-boosted trees (`shadowsync.bench.gbdt`) at learning rate 0.05, 31
  leaves, min_child_samples 20, stopped on the same tail;
- **lightgbm-tuned**: the grid point of LIGHTGBM_GRID (learning rate in {0.02, 0.05, 0.1} x
  num_leaves in {15, 31, 63} x min_child_samples in {20, 100}: 18 points) with the highest
  validation AUC. LightGBM here draws nothing at random (no bagging, deterministic), so a
  setting's one run is its value for every seed.

A baseline's setting is picked by its AUC on the validation tail (the rows `--val-share`
holds out of the training rows), never by eval AUC; the eval rows are scored once per run.

Every learner sees the same features. Multi-hot features (the movie genres, the review words)
are used where this shadowsync's training path reads them (`--multi-hot auto`), by the
baselines alike. Each number's quantile buckets (`data prepare --buckets`) are single ids to
shadowsync and DeepFM; LightGBM splits the number itself and leaves them out.

Goals, checked in code on each set and each split and printed met / not met (medians over
the seeds): the default job's eval AUC at most 0.002 below tuned DeepFM's and 0.005 below
tuned LightGBM's, within 0.003 of the local run's, and its eval NE below 1. Each gap is
printed with its bootstrap standard error over the seeds drawn. Also reported: the training
time the default job took to first reach, on the validation tail, the AUC of (untuned)
DeepFM's best epoch, against the time DeepFM took (same seed; None where it never did).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shadowsync.bench.common import (
    interleaved,
    job_cpu_s,
    median_of,
    print_table,
    write_bench,
)
from shadowsync.errors import UserError

SETS = ("movielens100k", "adult", "clothing-reviews")
TUNING_SPLIT = 0  # where defaults may be chosen; never reported
LEARNERS = ("default", "local", "deepfm", "deepfm-tuned", "lightgbm", "lightgbm-tuned")
# how far below each tuned baseline's median eval AUC the default job's may lie
AUC_GOALS = {"deepfm-tuned": 0.002, "lightgbm-tuned": 0.005}
LOCAL_AUC_GOAL = 0.003
BOOTSTRAP_RESAMPLES = 2000
LOCAL = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none"]
# each baseline's tuning budget: every point once, the setting with the best validation AUC
DEEPFM_GRID = {"lr": (3e-4, 1e-3, 3e-3), "dropout": (0.0, 0.2, 0.5)}
LIGHTGBM_GRID = {"learning_rate": (0.02, 0.05, 0.1), "num_leaves": (15, 31, 63),
                 "min_data_in_leaf": (20, 100)}


def multi_hot_trainable(data: Path) -> bool:
    """Whether this shadowsync's training path reads the prepared multi-hot features."""
    from shadowsync.config import TrainConfig
    from shadowsync.train.tasks import features_of

    try:
        features_of(TrainConfig(data=str(data / "train.parquet"), schema=str(data / "schema.toml")))
    except UserError as e:
        if "multi-hot" in str(e):
            return False
        raise
    return True


def prepare_data(out: Path, name: str, multi_hot: str, split_seed: int = 0) -> tuple[Path, bool]:
    """Set `name` prepared with the split drawn from `split_seed` (0: the README's)."""
    from shadowsync.data.prepare import BUCKETS, prepare

    def prepared(where: Path) -> bool:  # as this version prepares it (its buckets included)
        info = where / "dataset.json"
        return info.is_file() and json.loads(info.read_text()).get("buckets") == BUCKETS

    tag = f"-split{split_seed}" if split_seed else ""
    full = out / f"{name}{tag}"
    if not prepared(full):
        prepare(name, str(full), seed=split_seed)
    has_multi_hot = bool(json.loads((full / "dataset.json").read_text()).get("multi_hot"))
    use = multi_hot == "on" or (multi_hot == "auto" and multi_hot_trainable(full))
    if use or not has_multi_hot:
        return full, has_multi_hot
    single = out / f"{name}-no-multi-hot{tag}"
    if not prepared(single):
        prepare(name, str(single), seed=split_seed, multi_hot=False)
    return single, False


def _validations(run: Path) -> list[list[float]]:
    """[training seconds, validation AUC] of each validation of a run, in order."""
    trace = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("val_auc") is not None:
            trace.append([m["wall_s"], m["val_auc"]])
    return trace


def _train(data: Path, out: Path, seed: int, extra: list[str], options: list[str],
           timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "shadowsync.cli", "train", "--data", str(data / "train.parquet"),
           "--eval-data", str(data / "eval.parquet"), "--schema", str(data / "schema.toml"),
           "--seed", str(seed), "--out", str(out), "--no-progress", "-q", *options, *extra]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"bench realdata: a training run failed ({out}): {tail[0]}")
    s = json.loads((out / "summary.json").read_text())
    best = s.get("best") or {}
    return {"eval_auc": s["eval_auc"], "eval_ne": s["eval_ne"], "wall_s": wall,
            "train_wall_s": s["wall_s"], "best_epoch": best.get("epoch"),
            "examples": s["examples"], "early_stopped": s.get("early_stopped"),
            "validations": _validations(out)}


def _arrays(data: Path) -> tuple[str, str]:
    from shadowsync.data import tabular

    schema = str(data / "schema.toml")
    return (str(tabular.convert(str(data / "train.parquet"), schema)),
            str(tabular.convert(str(data / "eval.parquet"), schema)))


def _deepfm(arrays: tuple[str, str], seed: int, val_share: float,
            setting: dict[str, Any]) -> dict[str, Any]:
    from shadowsync.bench.deepfm import DeepFMConfig, train_deepfm

    t0 = time.perf_counter()
    r = train_deepfm(*arrays, val_share, seed, DeepFMConfig(**setting))
    best = r["history"][r["best_epoch"] - 1]
    reached = next(h["train_s"] for h in r["history"] if h["val_auc"] >= best["val_auc"])
    return {"eval_auc": r["eval_auc"], "eval_ne": r["eval_ne"], "val_auc": r["val_auc"],
            "wall_s": time.perf_counter() - t0, "best_epoch": r["best_epoch"],
            "epochs_run": r["epochs_run"], "best_val_auc": best["val_auc"],
            "time_to_best_val_auc_s": reached, "setting": setting}


def _lightgbm(arrays: tuple[str, str], seed: int, val_share: float,
              setting: dict[str, Any]) -> dict[str, Any]:
    from shadowsync.bench.gbdt import GbdtConfig, train_gbdt

    t0 = time.perf_counter()
    r = train_gbdt(*arrays, val_share, seed, GbdtConfig(**setting))
    return {"eval_auc": r["eval_auc"], "eval_ne": r["eval_ne"], "val_auc": r["val_auc"],
            "wall_s": time.perf_counter() - t0, "best_round": r["best_round"],
            "setting": setting}


BASELINES = {"deepfm": (_deepfm, DEEPFM_GRID, {"lr": 1e-3, "dropout": 0.2}),
             "lightgbm": (_lightgbm, LIGHTGBM_GRID,
                          {"learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 20})}


def grid_points(grid: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Every setting of `grid` ({option: values}), the last option varying fastest."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def pick_by_validation(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial with the highest validation AUC (the first of equals, in grid order). A
    trial's eval AUC is never read: the eval rows choose nothing."""
    return max(trials, key=lambda t: t["val_auc"])


class BaselineRuns:
    """One prepared split's baseline runs, kept by (baseline, setting, seed), so that a
    setting the tuning grid or another learner ran is not trained twice. LightGBM draws
    nothing at random here (no bagging, deterministic mode): its seed is not part of the key.
    With `keep`, each run is also a file there, which a later (or a parallel) run reads
    instead of training again."""

    def __init__(self, data: Path, val_share: float, keep: Path | None = None) -> None:
        self.arrays = _arrays(data)
        self.val_share = val_share
        self.keep = keep
        self.done: dict[str, dict[str, Any]] = {}

    def run(self, baseline: str, setting: dict[str, Any], seed: int) -> dict[str, Any]:
        key = json.dumps([baseline, setting, seed if baseline == "deepfm" else 0,
                          self.val_share], sort_keys=True)
        if key in self.done:
            return self.done[key]
        kept = None
        if self.keep is not None:
            kept = self.keep / f"{baseline}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
            if kept.is_file():
                self.done[key] = json.loads(kept.read_text())
                return self.done[key]
        self.done[key] = BASELINES[baseline][0](self.arrays, seed, self.val_share, dict(setting))
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            partial = kept.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps(self.done[key]))
            partial.replace(kept)  # whole or absent, for a run reading it at the same time
        return self.done[key]

    def tune(self, baseline: str, seed: int = 0) -> dict[str, Any]:
        """Every point of the baseline's grid once (with `seed`); the picked setting and the
        trials' validation AUC."""
        trials = []
        for point in grid_points(BASELINES[baseline][1]):
            trials.append({"setting": point, "val_auc": self.run(baseline, point, seed)["val_auc"]})
            print(f"  {baseline} {point}: validation AUC {trials[-1]['val_auc']:.4f}", flush=True)
        return {"picked": pick_by_validation(trials)["setting"], "trials": trials}


def tune_baselines(root: Path, sets: tuple[str, ...], multi_hot: str,
                   val_share: float) -> dict[str, Any]:
    """Each set's baselines tuned on the tuning split's validation rows, as the job's
    defaults were chosen there: {set: {baseline: {picked, trials}}}. Kept in
    ROOT/tuning.json and reused by later runs with the same grids and --val-share."""
    path = root / "tuning.json"
    stamp = {"grids": {b: {k: list(v) for k, v in spec[1].items()}
                       for b, spec in BASELINES.items()}, "val_share": val_share}
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if kept.get("stamp") != stamp:
        kept = {"stamp": stamp, "sets": {}}
    for name in sets:
        if name in kept["sets"]:
            continue
        started = time.perf_counter()
        runs = BaselineRuns(prepare_data(root / "data", name, multi_hot, TUNING_SPLIT)[0],
                            val_share, keep=root / "tuning" / name)
        kept["sets"][name] = {b: runs.tune(b) for b in BASELINES}
        kept["sets"][name]["wall_s"] = time.perf_counter() - started
        for b in BASELINES:
            print(f"  {name}: {b} tuned on split {TUNING_SPLIT}: "
                  f"{kept['sets'][name][b]['picked']}", flush=True)
        path.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
    return {name: kept["sets"][name] for name in sets}


def _time_to(trace: list[list[float]], auc: float) -> float | None:
    """Training seconds at the first validation at or above `auc`."""
    return next((t for t, a in trace if a >= auc), None)


def gap_noise(theirs: list[float], mine: list[float]) -> float | None:
    """How far median(theirs) - median(mine) moves with the draw of seeds: its bootstrap
    standard error, each learner's seeds resampled on their own (None: scipy, of the `bench`
    extra, not installed, or a single seed). A gap within it of a goal is met or missed by
    the seeds drawn."""
    try:
        import numpy as np
        from scipy.stats import bootstrap
    except ImportError:
        return None
    if min(len(theirs), len(mine)) < 2:
        return None

    def gap(a: Any, b: Any, axis: int = -1) -> Any:
        return np.median(a, axis=axis) - np.median(b, axis=axis)

    res = bootstrap((theirs, mine), gap, n_resamples=BOOTSTRAP_RESAMPLES, vectorized=True,
                    method="percentile", rng=np.random.default_rng(0))
    return float(res.standard_error)


def _summary(runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """One set's medians, spreads, goals and time to DeepFM's AUC."""
    key = {n: f"{name}/{n}" for n in LEARNERS}
    med = {n: {k: median_of(runs, key[n], k) for k in ("eval_auc", "eval_ne", "wall_s")}
           for n in LEARNERS}
    of = {n: [r for r in runs if r["variant"] == key[n]] for n in LEARNERS}
    spread = {n: {k: [min(r[k] for r in of[n]), max(r[k] for r in of[n])]
                  for k in ("eval_auc", "eval_ne")} for n in LEARNERS}
    auc = {n: med[n]["eval_auc"] for n in LEARNERS}
    seeds = {n: [r["eval_auc"] for r in of[n]] for n in LEARNERS}
    goals = {f"default_vs_{n.replace('-', '_')}_auc": {
        "gap": auc[n] - auc["default"], "goal": f"<= {g:g}", "met": auc[n] - auc["default"] <= g,
        "seed_noise": gap_noise(seeds[n], seeds["default"])} for n, g in AUC_GOALS.items()}
    local_gap = abs(auc["local"] - auc["default"])
    goals["default_vs_local_auc"] = {"gap": local_gap, "goal": f"abs <= {LOCAL_AUC_GOAL:g}",
                                     "met": local_gap <= LOCAL_AUC_GOAL,
                                     "seed_noise": gap_noise(seeds["local"], seeds["default"])}
    goals["default_eval_ne"] = {"gap": med["default"]["eval_ne"], "goal": "< 1",
                                "met": med["default"]["eval_ne"] < 1}
    by_repeat = {n: {r["repeat"]: r for r in of[n]} for n in LEARNERS}
    to_deepfm = []
    for rep, d in by_repeat["deepfm"].items():
        default = by_repeat["default"].get(rep)
        if default is not None:
            to_deepfm.append({"repeat": rep, "deepfm_best_val_auc": d["best_val_auc"],
                              "deepfm_s": d["time_to_best_val_auc_s"],
                              "default_s": _time_to(default["validations"], d["best_val_auc"])})
    reached = [t for t in to_deepfm if t["default_s"] is not None]
    # the seeds where the default job reached DeepFM's AUC: its time over DeepFM's
    time_ratio = (statistics.median(t["default_s"] for t in reached)
                  / statistics.median(t["deepfm_s"] for t in reached)) if reached else None
    # the untuned baselines' gaps: shown, judged by no goal
    untuned = {f"default_vs_{n}_auc": auc[n] - auc["default"] for n in BASELINES}
    settings = {n: of[n][0].get("setting") if of[n] else None for n in LEARNERS}
    return {"medians": med, "spread": spread, "goals": goals, "untuned_gaps": untuned,
            "settings": settings, "time_to_deepfm_auc": to_deepfm,
            "time_to_deepfm_auc_ratio": time_ratio,
            "reached_deepfm_auc": f"{len(reached)} of {len(to_deepfm)}"}


def _print(name: str, s: dict[str, Any]) -> None:
    print(f"\n  {name}")
    print_table([[n, s["medians"][n]["eval_auc"], f"{s['spread'][n]['eval_auc'][0]:.4f}-"
                  f"{s['spread'][n]['eval_auc'][1]:.4f}", s["medians"][n]["eval_ne"],
                  s["medians"][n]["wall_s"]] for n in LEARNERS],
                ["learner", "eval AUC", "AUC range", "eval NE", "wall s"])
    for k, gap in s["untuned_gaps"].items():
        print(f"  untuned baseline {k}: {gap:+.4f} (no goal)")
    for k, g in s["goals"].items():
        noise = g.get("seed_noise")
        spread = "" if noise is None else f", +-{noise:.4f} with the draw of seeds"
        print(f"  goal {k}: {g['gap']:+.4f} ({g['goal']}{spread}): "
              f"{'met' if g['met'] else 'NOT met'}")
    ratio = s["time_to_deepfm_auc_ratio"]
    print(f"  to DeepFM's validation AUC, default / DeepFM training time: "
          f"{'n/a' if ratio is None else f'{ratio:.2f}'} (reached on {s['reached_deepfm_auc']} "
          "seeds)")
    for t in s["time_to_deepfm_auc"]:
        mine = "never" if t["default_s"] is None else f"{t['default_s']:.1f} s"
        print(f"  seed {t['repeat']}: to DeepFM's validation AUC {t['deepfm_best_val_auc']:.4f}: "
              f"default {mine}, DeepFM {t['deepfm_s']:.1f} s (training time)")


def run_realdata_bench(out: str, seeds: int = 3, epochs: int = 20, val_share: float = 0.1,
                       sets: tuple[str, ...] = SETS, multi_hot: str = "auto",
                       extra: list[str] | None = None, splits: tuple[int, ...] = (1,),
                       tuning: bool = False) -> dict[str, Any]:
    """The protocol on `splits` (reported; `tuning`: on the tuning split instead), one split
    after another, its results written after each (a stopped run keeps the splits it ended)."""
    started = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise UserError(f"--sets: unknown {', '.join(unknown)} (choose from {', '.join(SETS)})")
    if not tuning and TUNING_SPLIT in splits:
        raise UserError(f"--splits: split {TUNING_SPLIT} is the tuning split, never reported "
                        "(run it with --tuning-split)")
    splits = (TUNING_SPLIT,) if tuning else splits
    # tuned when a tuned learner first runs: the others' first runs need not wait for it
    tuned = functools.cache(lambda: tune_baselines(root, sets, multi_hot, val_share))
    # the plain command: everything else is what --val-share adapts
    options = ["--epochs", str(epochs), "--val-share", str(val_share), *(extra or [])]
    runs: list[dict[str, Any]] = []
    walls: dict[int, float] = {}
    for split in splits:
        split_started = time.perf_counter()
        runs += _run_split(root, split, seeds, sets, multi_hot, options, val_share, tuned)
        walls[split] = time.perf_counter() - split_started
        result = write_results(root, runs, sets, tuple(walls), {
            "options": options, "seeds": seeds, "tuning_split": tuning,
            "tuning": tuned(), "grids": {b: spec[1] for b, spec in BASELINES.items()},
            "split_wall_s": walls, "bench_wall_s": time.perf_counter() - started,
            # what it cost whatever else ran: CPU seconds of the bench and its runs
            "bench_cpu_s": job_cpu_s()})
    return result


def collect_results(out: str, dirs: list[str], seeds: int = 3) -> dict[str, Any]:
    """OUT's results from the runs of earlier runs of this bench in `dirs` (for instance one
    command a set run side by side), no new runs: their runs.jsonl (a variant's seed run
    twice: the later run's), tuning.json and each split's wall time (the longest of the dirs,
    which ran side by side)."""
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    tuning: dict[str, Any] = {}
    walls: dict[int, float] = {}
    for d in map(Path, dirs):
        if not (d / "runs.jsonl").is_file():
            raise UserError(f"--collect: {d} holds no runs.jsonl of bench realdata")
        for line in (d / "runs.jsonl").read_text().splitlines():
            r = json.loads(line)
            by_key[(r["variant"], r["repeat"])] = r
        if (d / "tuning.json").is_file():
            tuning.update(json.loads((d / "tuning.json").read_text())["sets"])
        if (d / "bench.json").is_file():
            for k, w in json.loads((d / "bench.json").read_text()).get("split_wall_s",
                                                                       {}).items():
                walls[int(k)] = max(walls.get(int(k), 0.0), w)
    runs = list(by_key.values())
    sets = tuple(name for name in SETS if any(r["variant"].startswith(f"{name}/") for r in runs))
    splits = tuple(sorted({r["split"] for r in runs}))
    return write_results(Path(out), runs, sets, splits, {
        "seeds": seeds, "tuning": {n: tuning[n] for n in sets if n in tuning},
        "grids": {b: spec[1] for b, spec in BASELINES.items()}, "split_wall_s": walls,
        "collected_from": dirs})


def _run_split(root: Path, split: int, seeds: int, sets: tuple[str, ...], multi_hot: str,
               options: list[str], val_share: float,
               tuned: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every learner on every set of one split, `seeds` seeds each, interleaved."""
    data = {name: prepare_data(root / "data", name, multi_hot, split)[0] for name in sets}
    baselines = {name: BaselineRuns(data[name], val_share) for name in sets}
    counter: dict[str, int] = {}

    def learner(name: str, kind: str) -> Any:
        variant = f"{name}/split{split}/{kind}"

        def run() -> dict[str, Any]:
            counter[variant] = counter.get(variant, 0) + 1
            s = counter[variant] - 1
            baseline, _, tuned_kind = kind.partition("-")
            if baseline in BASELINES:
                setting = (tuned()[name][baseline]["picked"] if tuned_kind
                           else BASELINES[baseline][2])
                return {**baselines[name].run(baseline, setting, s), "split": split}
            return {**_train(data[name], root / "runs" / f"split{split}" / name / f"{kind}-{s}",
                             s, LOCAL if kind == "local" else [], options, 1800),
                    "split": split}
        return run

    variants = {f"{name}/split{split}/{kind}": learner(name, kind)
                for name in sets for kind in LEARNERS}
    return interleaved(variants, seeds, f"bench realdata split {split}",
                       log=root / "runs.jsonl")


def write_results(root: Path, runs: list[dict[str, Any]], sets: tuple[str, ...],
                  splits: tuple[int, ...], extra: dict[str, Any]) -> dict[str, Any]:
    """Print each set's summary on each split and write ROOT/bench.json from the runs, and
    ROOT/splitK/bench.json for each split K (a column each on the benchmarks page)."""
    per_split = {k: {name: _summary(runs, f"{name}/split{k}") for name in sets
                     if _complete(runs, f"{name}/split{k}", extra["seeds"])} for k in splits}
    per_split = {k: per_set for k, per_set in per_split.items() if per_set}
    for k, per_set in per_split.items():
        for name, s in per_set.items():
            _print(f"{name}, split {k}", s)
    tables = [_tuning_table(extra["tuning"])]
    whole: dict[str, dict[str, Any]] = {"ratios": {}, "ratio_spread": {}, "goals": {}}
    for k, per_set in per_split.items():
        part = _ratios(per_set)
        table = _medians_table(k, per_set, extra["seeds"])
        tables.append(table)
        for field, values in part.items():
            whole[field].update({f"{key.split(' ', 1)[0]} split{k} {key.split(' ', 1)[1]}": v
                                 for key, v in values.items()})
        write_bench(root / f"split{k}", "realdata", [r for r in runs if r.get("split") == k],
                    part["ratios"], {"ratio_spread": part["ratio_spread"],
                                     "goals": part["goals"], "tables": [tables[0], table],
                                     "sets": per_set, "split": k,
                                     "bench_wall_s": extra["split_wall_s"].get(k)})
    missed = [f"{name} split {k}: {goal}" for k, per_set in per_split.items()
              for name, s in per_set.items() for goal, g in s["goals"].items() if not g["met"]]
    print(f"\n  goals not met: {'; '.join(missed) if missed else 'none'}")
    path = write_bench(root, "realdata", runs, whole["ratios"],
                       {"sets": {str(k): v for k, v in per_split.items()},
                        "goals": whole["goals"], "ratio_spread": whole["ratio_spread"],
                        "tables": tables, "not_met": missed, **extra})
    print(f"\n  results: {path} (one column a split: {root}/splitK/bench.json)")
    return {"splits": per_split, "path": str(path), "not_met": missed}


def _complete(runs: list[dict[str, Any]], prefix: str, seeds: int) -> bool:
    """Whether every learner of one set and split ran all its seeds (runs of separate
    commands may be put together; a stopped one leaves its last split short)."""
    return all(len({r["repeat"] for r in runs if r["variant"] == f"{prefix}/{n}"}) >= seeds
               for n in LEARNERS)


def _ratios(per_set: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One split's figures for the page: per set, the AUC points the default job's median lies
    below each tuned and untuned baseline's, its distance to the local run's, its NE; each
    goal's gap with one bootstrap standard error over the seeds either side."""
    ratios: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    goals: dict[str, str] = {}
    for name, s in per_set.items():
        for k, g in s["goals"].items():
            ratios[f"{name} {k}"] = g["gap"]
            goals[f"{name} {k}"] = g["goal"]
            if g.get("seed_noise") is not None:
                spread[f"{name} {k}"] = [g["gap"] - g["seed_noise"], g["gap"] + g["seed_noise"]]
        ratios.update({f"{name} {k}": gap for k, gap in s["untuned_gaps"].items()})
    return {"ratios": ratios, "ratio_spread": spread, "goals": goals}


def _medians_table(split: int, per_set: dict[str, Any], seeds: int) -> dict[str, Any]:
    columns = ["set", *LEARNERS, "default eval NE"]
    rows = [[name, *(f"{s['medians'][n]['eval_auc']:.4f} ({s['spread'][n]['eval_auc'][0]:.4f}"
                     f"-{s['spread'][n]['eval_auc'][1]:.4f})" for n in LEARNERS),
             f"{s['medians']['default']['eval_ne']:.4f}"] for name, s in per_set.items()]
    return {"title": f"split {split}: eval AUC, median of {seeds} seeds (range)",
            "columns": columns, "rows": rows}


def _tuning_table(tuned: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for name, per_baseline in tuned.items():
        for b in BASELINES:
            trials = per_baseline[b]["trials"]
            best = pick_by_validation(trials)
            rows.append([name, b, ", ".join(f"{k} {v:g}" for k, v in best["setting"].items()),
                         f"{best['val_auc']:.4f}", f"{min(t['val_auc'] for t in trials):.4f}-"
                         f"{max(t['val_auc'] for t in trials):.4f}", len(trials)])
    return {"title": f"the baselines tuned on split {TUNING_SPLIT} (validation AUC; eval rows "
                     "unread)", "columns": ["set", "baseline", "picked", "validation AUC",
                                             "grid's validation AUC", "grid points"],
            "rows": rows}
