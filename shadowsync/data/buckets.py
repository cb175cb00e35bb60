"""Numbers cut into quantile buckets: each dense column also as a categorical feature.

A dense input times a weight draws a line in its number; an embedding per bucket draws any
step or bump (a capital gain above some amount, a working week of exactly 40 hours). A
bucketized feature's id is the bucket its number falls in,

    id(x) = #{e in edges : e <= x}     (0 below the first edge, len(edges) at or past the last),

its edges the training rows' quantiles (`quantile_edges`). `data prepare` writes them into the
schema; a run with --val-share adds them to any array directory (and so to Parquet and CSV,
which convert into one) with `quantile_buckets`: the directory as it is, and one more
single-id column per dense column, its edges computed from the rows the model fits on only
(never the validation tail nor the eval rows) and declared in features.json (``bucketize``,
``edges``), so every reader of the run (eval, `shadowsync.load`, the exported model's
schema) cuts at the same edges (`cut_like` applies them to other rows).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shadowsync.data import arrays
from shadowsync.data.cache import NpyWriter, built_once, cache_root
from shadowsync.errors import UserError

BUCKETS = 128  # `data prepare --buckets` left open
SUFFIX = "_quantile"  # a bucketized feature's name: its column's and this
FORMAT_VERSION = 1
_CHUNK_ROWS = 1 << 20  # rows cut at a time, so a large memory map is not read at once


def quantile_edges(x: np.ndarray, buckets: int) -> list[float]:
    """Edges that cut `x` into about `buckets` buckets of equal counts (id = #edges <= x).

    A value that alone holds more than 1/buckets of the rows (a spike: zero capital gain, 40
    hours a week) gets a bucket of its own, edges halfway to its neighbouring values; the
    other values are cut at their own quantiles into the buckets left. With at most
    `buckets` distinct values, each gets its own bucket."""
    values, counts = np.unique(x, return_counts=True)
    mid = (values[1:] + values[:-1]) / 2  # halfway between neighbouring values
    if len(values) <= buckets:
        return mid.tolist()
    spike = counts > len(x) / buckets
    rest = x[~np.isin(x, values[spike])]
    edges = np.quantile(rest, np.linspace(0, 1, buckets - int(spike.sum()) + 1)[1:-1])
    around = np.flatnonzero(spike[1:] | spike[:-1])  # the gaps either side of a spike
    return np.unique(np.concatenate([edges, mid[around]])).tolist()


def bucket_ids(edges: Sequence[float], values: np.ndarray) -> np.ndarray:
    """id(x) = #{e in edges : e <= x} of each value, int64."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64),
                           np.asarray(values, dtype=np.float64), side="right").astype(np.int64)


@dataclass(frozen=True)
class Cut:
    """One bucketized feature: `name`, the bucket of dense column `column` among `edges`."""

    name: str
    column: str
    edges: tuple[float, ...]

    def entry(self) -> dict[str, object]:
        """Its features.json entry (`tabular.TableSchema.features` writes the same)."""
        return {"name": self.name, "table_size": len(self.edges) + 1,
                "bucketize": self.column, "edges": list(self.edges)}


def row_count(path: str) -> int:
    """Rows of an array directory, from labels.npy's header."""
    return len(np.load(Path(path) / "labels.npy", mmap_mode="r"))


def dense_names(path: str, num_dense: int) -> list[str]:
    """An array directory's dense columns by name: features.json's, else I1..ID."""
    named = (arrays.declared(path) or {}).get("dense")
    if (isinstance(named, list) and len(named) == num_dense
            and all(isinstance(n, str) for n in named)):
        return list(named)
    return [f"I{i + 1}" for i in range(num_dense)]


def _num_single(path: str) -> int:
    """Single-id columns of an array directory (cats.npy's), from its header."""
    cats = np.load(Path(path) / "cats.npy", mmap_mode="r")
    return cats.shape[1] if cats.ndim == 2 else 0


def _singles(path: str, count: int) -> list[dict[str, object]]:
    """features.json's single-id entries where it names each of the `count` columns, else
    C1..CT (no table size: the run's --table-size sizes them)."""
    named = (arrays.declared(path) or {}).get("categorical")
    if (isinstance(named, list) and len(named) == count
            and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in named)):
        return [dict(c) for c in named]
    return [{"name": f"C{j + 1}"} for j in range(count)]


def left_whole(path: str) -> list[str]:
    """The dense columns features.json keeps without buckets (``"no_buckets"``)."""
    whole = (arrays.declared(path) or {}).get("no_buckets", [])
    if not isinstance(whole, list) or not all(isinstance(c, str) for c in whole):
        raise UserError(f"{Path(path) / arrays.FEATURES}: \"no_buckets\" must be a list of "
                        "dense column names")
    return whole


def columns_to_cut(path: str, whole: Sequence[str] = ()) -> list[tuple[int, str]]:
    """(index, name) of the dense columns of array directory `path` that get buckets: all
    but those in `whole` (--no-buckets) or features.json's "no_buckets", and those a
    single-id feature of the directory bucketizes already (a schema's)."""
    dense = np.load(Path(path) / "dense.npy", mmap_mode="r")
    names = dense_names(path, dense.shape[1] if dense.ndim == 2 else 0)
    unknown = [c for c in whole if c not in names]
    if unknown:
        raise UserError(f"--no-buckets: {path} has no dense column '{unknown[0]}' (its dense "
                        f"columns: {', '.join(names) or 'none'})")
    skip = {*whole, *left_whole(path),
            *(c.get("bucketize") for c in _singles(path, _num_single(path)))}
    return [(j, column) for j, column in enumerate(names) if column not in skip]


def training_cuts(path: str, rows: int, buckets: int, whole: Sequence[str] = ()) -> list[Cut]:
    """Each of `columns_to_cut`'s cut, edges from rows [0, rows) of array directory `path`
    alone; a constant column has no edges, and no cut."""
    dense = np.load(Path(path) / "dense.npy", mmap_mode="r")
    taken = {str(c["name"]) for c in _singles(path, _num_single(path))} | {
        str(m["name"]) for m in arrays.multi_hot_specs(path)}
    cuts = []
    for j, column in columns_to_cut(path, whole):
        edges = quantile_edges(np.asarray(dense[:rows, j], dtype=np.float64), buckets)
        if edges:
            name = _free_name(column + SUFFIX, taken)
            taken.add(name)
            cuts.append(Cut(name, column, tuple(edges)))
    return cuts


def _free_name(name: str, taken: set[str]) -> str:
    """`name`, or with a number after it where the directory has a feature of that name."""
    return next(n for n in (name, *(f"{name}{k}" for k in range(2, len(taken) + 3)))
                if n not in taken)


def _stamp(path: str) -> list[object]:
    """What identifies an array directory's contents: each file's path, size and time."""
    files = sorted(f for f in Path(path).iterdir() if f.is_file())
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def _derived(path: str, key: object, cuts_of: Callable[[], list[Cut]]) -> str:
    """`path` with the cuts' columns added (`_build`), in a cache directory named by `key`
    and the directory's contents: built once, by the first process that asks."""
    digest = hashlib.sha1(json.dumps([_stamp(path), key, FORMAT_VERSION],
                                     default=list).encode()).hexdigest()[:16]
    dest = cache_root() / "buckets" / f"{Path(path).resolve().name}-{digest}"
    return str(built_once(dest, "meta.json", lambda tmp: _build(tmp, path, cuts_of())))


def quantile_buckets(path: str, rows: int, buckets: int, whole: Sequence[str] = ()) -> str:
    """Array directory `path` with each dense column's bucketized feature (`training_cuts`
    of its first `rows` rows, up to `buckets` buckets) after its single-id columns; `path`
    itself where no column gets one (or `buckets` is 0)."""
    if buckets < 0 or buckets == 1:
        raise UserError(f"--buckets must be 0 (none) or at least 2, got {buckets}")
    if buckets == 0 or not columns_to_cut(path, whole):
        return path
    key = ["rows", rows, buckets, sorted(whole)]
    out = _derived(path, key, lambda: training_cuts(path, rows, buckets, whole))
    return out if _added(out) else path


def cut_like(path: str, features: Sequence[dict[str, object]]) -> str:
    """Array directory `path` with the bucketized single-id features of `features` (a run's
    `sparse_features`: name, bucketize, edges) that it lacks by name, cut at their edges:
    other rows as the run's own were cut. `path` itself where it lacks none."""
    cuts = [Cut(str(f["name"]), str(f["bucketize"]), tuple(float(e) for e in f["edges"]))
            for f in features if f.get("bucketize") and not f.get("multi_hot")]
    if cuts and not arrays.is_array_dir(path):
        raise UserError(f"{path}: the model cuts numbers into quantile buckets "
                        f"({cuts[0].name}...), which this format's rows lack; give an array "
                        "directory, Parquet or CSV")
    have = {str(c["name"]) for c in _singles(path, _num_single(path))} if cuts else set()
    cuts = [c for c in cuts if c.name not in have]
    if not cuts:
        return path
    return _derived(path, ["cuts", [c.entry() for c in cuts]], lambda: cuts)


def _added(path: str) -> int:
    return int(json.loads((Path(path) / "meta.json").read_text())["added"])


def _build(tmp: Path, path: str, cuts: list[Cut]) -> None:
    """`tmp`: the files of `path` linked, cats.npy with the cuts' columns after its own, and
    features.json declaring them."""
    src = Path(path).resolve()
    dense = np.load(src / "dense.npy", mmap_mode="r")
    names = dense_names(path, dense.shape[1])
    missing = [c.column for c in cuts if c.column not in names]
    if missing:
        raise UserError(f"{path}: no dense column '{missing[0]}' to cut into buckets (its dense "
                        f"columns: {', '.join(names) or 'none'})")
    for f in src.iterdir():  # the rows as they are: labels, dense, multi-hot features
        if f.is_file() and f.suffix == ".npy" and f.name != "cats.npy":
            os.symlink(f, tmp / f.name)
    cats = np.load(src / "cats.npy", mmap_mode="r")
    columns = [names.index(c.column) for c in cuts]
    writer = NpyWriter(tmp / "cats.npy", cats.dtype, (cats.shape[1] + len(cuts),))
    for lo in range(0, len(cats), _CHUNK_ROWS):
        part = np.asarray(dense[lo:lo + _CHUNK_ROWS])
        writer.append(np.hstack([np.asarray(cats[lo:lo + _CHUNK_ROWS]),
                                 *(bucket_ids(c.edges, part[:, j])[:, None].astype(cats.dtype)
                                   for c, j in zip(cuts, columns, strict=True))]))
    writer.close()
    doc = dict(arrays.declared(path) or {})
    doc.update({"dense": names,
                "categorical": [*_singles(path, cats.shape[1]), *(c.entry() for c in cuts)],
                "multi_hot": doc.get("multi_hot", [])})
    (tmp / arrays.FEATURES).write_text(json.dumps(doc, indent=1) + "\n")
    (tmp / "meta.json").write_text(json.dumps({"source": str(src), "added": len(cuts)}) + "\n")
