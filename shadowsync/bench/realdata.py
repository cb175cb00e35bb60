"""`shadowsync bench realdata`: real data, three learners side by side.

On MovieLens 100K as clicks (`shadowsync data prepare movielens100k`; a fixed 90k / 10k
split), for each seed, interleaved:

- **default**: the default job (2 trainers, one embedding server, s-bmuf) with `--epochs`,
  `--val-share`, `--eval-points`, `--early-stop`, `--lr-decay-on-plateau`, `--interaction
  dot+cat` and `--embedding-dim 32` (the README's real-data command); its best checkpoint's
  eval AUC / NE;
- **local**: the same options with 1 trainer, local tables and `--sync none`;
- **deepfm**: a plain single-process PyTorch DeepFM (`shadowsync.bench.deepfm`) with Adam,
  its best epoch on the same validation tail.

Every learner sees the same features. Multi-hot features (the movie genres) are used where
this shadowsync's training path reads them (`--multi-hot auto`), by DeepFM alike.

Goals, checked in code and printed met / not met: the default job's median eval AUC within
0.003 of DeepFM's and within 0.005 of the local run's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shadowsync.bench.common import (
    interleaved,
    median_of,
    print_table,
    ratio_of_medians,
    write_bench,
)
from shadowsync.errors import UserError

GOALS = {"default_vs_deepfm_auc": 0.003, "default_vs_local_auc": 0.005}
LOCAL = ["--trainers", "1", "--embedding-servers", "0", "--sync", "none"]


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


def prepare_data(out: Path, multi_hot: str, split_seed: int = 0) -> tuple[Path, bool]:
    """The prepared MovieLens split drawn from `split_seed` (0: the README's)."""
    from shadowsync.data.prepare import prepare

    tag = f"-split{split_seed}" if split_seed else ""
    full = out / f"data{tag}"
    if not (full / "dataset.json").is_file():
        prepare("movielens100k", str(full), seed=split_seed)
    use = multi_hot == "on" or (multi_hot == "auto" and multi_hot_trainable(full))
    if use:
        return full, True
    single = out / f"data-no-multi-hot{tag}"
    if not (single / "dataset.json").is_file():
        prepare("movielens100k", str(single), seed=split_seed, multi_hot=False)
    return single, False


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
            "examples": s["examples"], "early_stopped": s.get("early_stopped")}


def _deepfm(data: Path, seed: int, val_share: float) -> dict[str, Any]:
    from shadowsync.bench.deepfm import train_deepfm
    from shadowsync.data import tabular

    schema = str(data / "schema.toml")
    t0 = time.perf_counter()
    train = tabular.convert(str(data / "train.parquet"), schema)
    ev = tabular.convert(str(data / "eval.parquet"), schema)
    r = train_deepfm(str(train), str(ev), val_share, seed)
    return {"eval_auc": r["eval_auc"], "eval_ne": r["eval_ne"],
            "wall_s": time.perf_counter() - t0, "best_epoch": r["best_epoch"],
            "epochs_run": r["epochs_run"]}


def run_realdata_bench(out: str, seeds: int = 3, epochs: int = 10, val_share: float = 0.1,
                       early_stop: int = 12, eval_points: int = 4, multi_hot: str = "auto",
                       extra: list[str] | None = None, split_seed: int = 0) -> dict[str, Any]:
    started = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    data, used_multi_hot = prepare_data(root, multi_hot, split_seed)
    # --eval-points validations an epoch: --early-stop counts them (12 at 4 an epoch: three
    # epochs without improvement)
    options = ["--epochs", str(epochs), "--val-share", str(val_share), "--early-stop",
               str(early_stop), "--eval-points", str(eval_points), "--lr-decay-on-plateau",
               "--interaction", "dot+cat", "--embedding-dim", "32", *(extra or [])]
    counter = {"default": 0, "local": 0, "deepfm": 0}

    def seed_of(name: str) -> int:
        counter[name] += 1
        return counter[name] - 1

    def default() -> dict[str, Any]:
        s = seed_of("default")
        return _train(data, root / "runs" / f"default-{s}", s, [], options, 1200)

    def local() -> dict[str, Any]:
        s = seed_of("local")
        return _train(data, root / "runs" / f"local-{s}", s, LOCAL, options, 1200)

    def deepfm() -> dict[str, Any]:
        return _deepfm(data, seed_of("deepfm"), val_share)

    runs = interleaved({"default": default, "local": local, "deepfm": deepfm}, seeds,
                       "bench realdata", log=root / "runs.jsonl")
    names = ["default", "local", "deepfm"]
    med = {n: {k: median_of(runs, n, k) for k in ("eval_auc", "eval_ne", "wall_s")}
           for n in names}
    spread = {n: {k: [min(r[k] for r in runs if r["variant"] == n),
                      max(r[k] for r in runs if r["variant"] == n)]
                  for k in ("eval_auc", "eval_ne")} for n in names}
    ratios = {}
    for other in ("local", "deepfm"):
        for key in ("eval_auc", "eval_ne", "wall_s"):
            ratios[f"default/{other} {key}"] = ratio_of_medians(runs, "default", other, key)[0]
    gaps = {"default_vs_deepfm_auc": med["deepfm"]["eval_auc"] - med["default"]["eval_auc"],
            "default_vs_local_auc": med["local"]["eval_auc"] - med["default"]["eval_auc"]}
    goals = {k: {"gap": gaps[k], "within": GOALS[k], "met": gaps[k] <= GOALS[k],
                 "goal": f"<= {GOALS[k]:g}"} for k in GOALS}
    print()
    print_table([[n, med[n]["eval_auc"], f"{spread[n]['eval_auc'][0]:.4f}-"
                  f"{spread[n]['eval_auc'][1]:.4f}", med[n]["eval_ne"], med[n]["wall_s"],
                  statistics.median([r["best_epoch"] for r in runs if r["variant"] == n
                                     and r.get("best_epoch") is not None] or [float("nan")])]
                 for n in names],
                ["learner", "eval AUC", "AUC range", "eval NE", "wall s", "best epoch"])
    print()
    for k, v in ratios.items():
        print(f"  {k:<26} {v:.4f}" if v is not None else f"  {k:<26} n/a")
    for k, g in goals.items():
        print(f"  goal {k}: median AUC gap {g['gap']:+.4f} (<= {g['within']}): "
              f"{'met' if g['met'] else 'NOT met'}")
    # the AUC points below the other learner, which the goals bound, go in as ratios too
    path = write_bench(root, "realdata", runs, {**ratios, **gaps},
                       {"medians": med, "spread": spread, "goals": goals,
                        "multi_hot": used_multi_hot, "options": options,
                        "data": str(data), "seeds": seeds, "split_seed": split_seed,
                        "bench_wall_s": time.perf_counter() - started})
    print(f"\n  results: {path}")
    return {"medians": med, "goals": goals, "path": str(path)}
