"""Train your own model on your own arrays from Python, over two trainers with background
BMUF.

    python examples/own_arrays.py                 # 40,000 rows into my_arrays/, runs/mine/
    python examples/own_arrays.py --rows 12000 --out /tmp/mine

The arrays are three .npy files in one directory: labels (N,), dense (N, D) float32 and
cats (N, T) integer ids; here 5 dense and 3 categorical features whose clicks depend on both.
"""

import argparse
import os

import numpy as np

import shadowsync


def write_arrays(path: str, n: int, d: int = 5, t: int = 3, ids: int = 50) -> None:
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((n, d)).astype(np.float32)
    cats = rng.integers(0, ids, (n, t))
    effect = rng.standard_normal((t, ids))
    logit = dense @ rng.standard_normal(d) + effect[np.arange(t), cats].sum(1)
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    os.makedirs(path, exist_ok=True)
    for name, array in (("labels", labels), ("dense", dense), ("cats", cats)):
        np.save(os.path.join(path, f"{name}.npy"), array)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40_000, help="rows of data to write")
    parser.add_argument("--data", default="my_arrays", help="directory for the arrays")
    parser.add_argument("--out", default="runs/mine", help="the run directory")
    args = parser.parse_args()

    write_arrays(args.data, args.rows)
    # model: a MODULE:FUNCTION on the Python path (this script's directory is on it).
    result = shadowsync.train(data=args.data, model="my_model:mlp", trainers=2,
                              sync="s-bmuf", table_size=50, out=args.out)
    print(result.summary["eval_ne"], result.out, result.checkpoint)


if __name__ == "__main__":  # the job starts processes: guard the script, as multiprocessing asks
    main()
