"""A user's own array directory of a census-like table against LightGBM, with the plain command.

The adult census set is written as a user would have it (`data prepare adult --format arrays
--buckets 0`: categorical ids, every numeric column a float, no buckets in a schema), then
trained with nothing but `shadowsync train --data TRAIN --eval-data EVAL --epochs 20
--val-share 0.1 --seed S` (the run cuts each numeric column into quantile buckets of its own
training rows) on each split, beside LightGBM at its default setting (`bench realdata`'s
untuned one: learning rate 0.05, 31 leaves, min_child_samples 20, stopped on the same
validation tail). Prints each split's median eval AUC over the seeds and the gap.

    python scripts/census_arrays.py --out runs/census-arrays --splits 1,2,3 --seeds 3

Needs the `bench` extra (lightgbm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from shadowsync.bench.common import print_table
from shadowsync.bench.gbdt import GbdtConfig, train_gbdt
from shadowsync.data.prepare import prepare

VAL_SHARE = 0.1
GOAL = 0.005  # how far below LightGBM the plain command may land


def plain_run(data: Path, out: Path, seed: int) -> float:
    """Eval AUC of the plain command on `data`'s arrays (a finished run is read back)."""
    summary = out / "summary.json"
    if not summary.is_file():
        subprocess.run([sys.executable, "-m", "shadowsync.cli", "train", "--data",
                        str(data / "train"), "--eval-data", str(data / "eval"), "--epochs", "20",
                        "--val-share", str(VAL_SHARE), "--seed", str(seed), "--out", str(out),
                        "--no-progress", "-q"], check=True)
    return float(json.loads(summary.read_text())["eval_auc"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/census-arrays")
    ap.add_argument("--splits", default="1,2,3", help="split seeds of `data prepare`")
    ap.add_argument("--seeds", type=int, default=3, help="training seeds a split")
    args = ap.parse_args()
    root = Path(args.out)
    rows, result = [], {}
    for split in (int(s) for s in args.splits.split(",")):
        data = root / f"adult-arrays-split{split}"
        if not (data / "eval").is_dir():
            prepare("adult", str(data), seed=split, fmt="arrays", buckets=0)
        ours = [plain_run(data, root / f"split{split}-seed{s}", s) for s in range(args.seeds)]
        gbdt = train_gbdt(str(data / "train"), str(data / "eval"), VAL_SHARE, 0, GbdtConfig())
        gap = gbdt["eval_auc"] - statistics.median(ours)
        result[split] = {"plain_command_eval_auc": ours, "lightgbm_eval_auc": gbdt["eval_auc"],
                         "gap": gap, "met": gap <= GOAL}
        rows.append([split, " / ".join(f"{a:.4f}" for a in ours),
                     round(statistics.median(ours), 4), round(gbdt["eval_auc"], 4),
                     round(gap, 4), "met" if gap <= GOAL else "not met"])
    print_table(rows, ["split", "plain command (seeds)", "median", "LightGBM", "gap",
                       f"goal <= {GOAL}"])
    (root / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
