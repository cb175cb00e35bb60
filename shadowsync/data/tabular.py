"""Parquet and CSV files described by a schema, converted once into an array directory.

``--data PATH --schema schema.toml``: PATH is a ``.parquet`` / ``.csv`` file or a directory
of them (read in name order). The schema says which column is what::

    label = "click"                       # 0/1 (bool, integer or float in [0, 1])
    dense = ["age", "price"]              # numbers; a null, NaN or infinity is an error
    no_buckets = ["price"]                # optional: dense columns a run's quantile buckets
                                          # (--buckets, on with --val-share) leave whole

    [[categorical]]                       # one id per row
    name = "user_id"
    table_size = 1000                     # ids must be in [0, table_size) ...
    hash = false                          # ... unless hash = true: id % table_size, and
                                          # strings hashed (stable across runs) first
    # ids = "raw"                         # or: raw 64-bit ids (`shadowsync.data.ids.
                                          # raw_ids`: an integer's bits, a string's hash)
                                          # for --tables dynamic; table_size is optional,
                                          # the table's row budget

    [[categorical]]                       # ids from a numeric column: the number of
    name = "age_quantile"                 # `edges` at or below its value, 0..len(edges)
    bucketize = "age"                     # (`data prepare` writes these: quantiles of the
    edges = [-0.9, -0.2, 0.5]             # training rows); table_size = len(edges) + 1
    table_size = 4

    [[multi_hot]]                         # a list of ids per row (Parquet list column; in
    name = "genres"                       # CSV a string split at `separator`, default "|")
    table_size = 20
    pooling = "sum"                       # or "mean"
    weights = "genre_weights"             # optional list column of floats, one per id

The files are read with pyarrow in record batches (bounded memory) and written into a cache
of ``.npy`` files in the array-directory layout (``labels.npy``, ``dense.npy``, ``cats.npy``,
``NAME.values.npy`` / ``NAME.offsets.npy`` / ``NAME.weights.npy`` per multi-hot feature and
``features.json``), once; later runs map the cache. A bad value stops the conversion with one
line: ``FILE:ROW: column 'x' ...`` (ROW counts data rows from 1; a CSV's line is ROW + 1).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from shadowsync.data.buckets import bucket_ids
from shadowsync.data.cache import NpyWriter, built_once, cache_root
from shadowsync.data.ids import fold_words, raw_ids
from shadowsync.errors import UserError
from shadowsync.toml_file import read_toml

if TYPE_CHECKING:
    import pyarrow

# Names the row `i` of a batch (FILE:LINE) in a message.
Where = Callable[[int], str]


def arrow() -> ModuleType:
    """pyarrow with its compute, csv and parquet modules, imported on first use: start-up
    cost (pyarrow takes 0.1-0.6 s to import, and every worker process imports this module)."""
    import pyarrow.compute  # importing a submodule makes it an attribute of pyarrow
    import pyarrow.csv
    import pyarrow.parquet

    return pyarrow


FORMAT_VERSION = 2  # 2: a raw column's strings keep all 64 bits of their hash
SUFFIXES = (".parquet", ".pq", ".csv")
BATCH_ROWS = 65_536  # rows per record batch: what the conversion holds in memory at a time
POOLINGS = ("sum", "mean")


@dataclass(frozen=True)
class Sparse:
    """A categorical (one id) or multi-hot (a list of ids) column."""

    name: str
    table_size: int | None  # None: a raw column whose budget the run's options set
    hash: bool = False
    raw: bool = False  # ids = "raw": not folded (dynamic tables map them)
    pooling: str = "sum"
    weights: str | None = None
    separator: str = "|"
    bucketize: str | None = None  # the numeric column whose value's bucket is the id
    edges: tuple[float, ...] = ()  # increasing bucket edges: id = #edges <= value

    def bucket_ids(self, values: np.ndarray) -> np.ndarray:
        """id(x) = #{e in edges : e <= x}: bucket 0 below the first edge, len(edges) at or
        above the last."""
        return bucket_ids(self.edges, values)


@dataclass(frozen=True)
class TableSchema:
    path: str
    label: str
    dense: tuple[str, ...]
    categorical: tuple[Sparse, ...]
    multi_hot: tuple[Sparse, ...]
    no_buckets: tuple[str, ...] = ()  # dense columns a run's --buckets leaves whole

    @classmethod
    def load(cls, path: str) -> TableSchema:
        doc = read_toml(path, f"--schema {path}")
        known = {"label", "dense", "categorical", "multi_hot", "no_buckets"}
        for key in doc:
            if key not in known:
                expected = ", ".join(sorted(known))
                raise UserError(f"{path}: unknown key '{key}' (expected {expected})")
        label = doc.get("label")
        if not isinstance(label, str) or not label:
            raise UserError(f"{path}: 'label' must name the label column")
        dense = doc.get("dense", [])
        if not isinstance(dense, list) or not all(isinstance(d, str) for d in dense):
            raise UserError(f"{path}: 'dense' must be a list of column names")
        cats = tuple(_sparse(path, "categorical", i, t)
                     for i, t in enumerate(_tables(path, doc, "categorical")))
        multi = tuple(_sparse(path, "multi_hot", i, t)
                      for i, t in enumerate(_tables(path, doc, "multi_hot")))
        if not cats and not multi:
            raise UserError(f"{path}: no [[categorical]] or [[multi_hot]] column (at least one "
                            "is needed; a number gives one as a [[categorical]] with bucketize = "
                            "its column and edges, see docs/real-data.md)")
        whole = doc.get("no_buckets", [])
        if not isinstance(whole, list) or not all(w in dense for w in whole):
            raise UserError(f"{path}: 'no_buckets' must be a list of dense columns (of "
                            f"{', '.join(map(str, dense)) or 'none'})")
        schema = cls(path, label, tuple(dense), cats, multi, tuple(whole))
        names = schema.names()
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise UserError(f"{path}: column '{dup}' is named twice")
        return schema

    def names(self) -> list[str]:
        """Every column and feature name the schema gives (each at most once)."""
        return self._listed([c.name for c in self.categorical])

    def columns(self) -> list[str]:
        """The file columns read: a bucketized feature reads its numeric column."""
        return list(dict.fromkeys(self._listed([c.bucketize or c.name
                                                for c in self.categorical])))

    def _listed(self, categorical: list[str]) -> list[str]:
        return [self.label, *self.dense, *categorical, *(m.name for m in self.multi_hot),
                *(m.weights for m in self.multi_hot if m.weights)]

    def role(self, column: str) -> str:
        if column == self.label:
            return "label"
        if column in self.dense or any(c.bucketize == column for c in self.categorical):
            return "dense"
        if any(c.name == column for c in self.categorical):
            return "categorical"
        if any(m.weights == column for m in self.multi_hot):
            return "multi-hot weights"
        return "multi_hot"

    def digest(self) -> str:
        text = json.dumps([self.label, self.dense, [vars(c) for c in self.categorical],
                           [vars(m) for m in self.multi_hot],
                           *([self.no_buckets] if self.no_buckets else [])], sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def features(self) -> dict[str, object]:
        """features.json of the converted directory (the shared array-directory format)."""
        return {"dense": list(self.dense),
                "categorical": [{"name": c.name, **_size(c),
                                 **({"ids": "raw"} if c.raw else {}),
                                 **({"bucketize": c.bucketize, "edges": list(c.edges)}
                                    if c.bucketize else {})}
                                for c in self.categorical],
                "multi_hot": [{"name": m.name, **_size(m),
                               "pooling": m.pooling, "weighted": m.weights is not None,
                               **({"ids": "raw"} if m.raw else {})}
                              for m in self.multi_hot],
                **({"no_buckets": list(self.no_buckets)} if self.no_buckets else {})}


def _size(column: Sparse) -> dict[str, int]:
    return {} if column.table_size is None else {"table_size": column.table_size}


def _tables(path: str, doc: dict, key: str) -> list[dict]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise UserError(f"{path}: '{key}' must be [[{key}]] tables")
    return value


def _sparse(path: str, kind: str, i: int, t: dict) -> Sparse:
    where = f"{path}: [[{kind}]] #{i + 1}"
    allowed = {"name", "table_size", "hash", "ids"} | ({"pooling", "weights", "separator"}
                                                if kind == "multi_hot" else
                                                {"bucketize", "edges"})
    for key in t:
        if key not in allowed:
            raise UserError(f"{where}: unknown key '{key}' (expected {', '.join(sorted(allowed))})")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: 'name' must name a column")
    raw = t.get("ids", "table") == "raw"
    size = t.get("table_size")
    if (size is not None or not raw) and (
            not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise UserError(f"{where} ({name}): 'table_size' must be a positive integer"
                        + ("" if raw else " (or ids = \"raw\" for a dynamic table)"))
    pooling = t.get("pooling", "sum")
    if pooling not in POOLINGS:
        raise UserError(f"{where} ({name}): 'pooling' must be one of {', '.join(POOLINGS)}")
    hashed = t.get("hash", False)
    if not isinstance(hashed, bool):
        raise UserError(f"{where} ({name}): 'hash' must be true or false")
    if t.get("ids", "table") not in ("table", "raw"):
        raise UserError(f"{where} ({name}): 'ids' must be \"raw\" (or left out)")
    if raw and hashed:
        raise UserError(f"{where} ({name}): ids = \"raw\" keeps ids unfolded; hash = true "
                        "folds them: choose one")
    weights = t.get("weights")
    if weights is not None and (not isinstance(weights, str) or not weights):
        raise UserError(f"{where} ({name}): 'weights' must name a column")
    sep = t.get("separator", "|")
    if not isinstance(sep, str) or not sep:
        raise UserError(f"{where} ({name}): 'separator' must be a non-empty string")
    bucketize, edges = _buckets(where, name, t, size, hashed or raw)
    return Sparse(name, size, hashed, raw, pooling, weights, sep, bucketize, edges)


def _buckets(where: str, name: str, t: dict, size: int | None, hashed_or_raw: bool
             ) -> tuple[str | None, tuple[float, ...]]:
    """A bucketized categorical's numeric column and edges, checked (None, () if not one)."""
    column, edges = t.get("bucketize"), t.get("edges")
    if column is None and edges is None:
        return None, ()
    if not isinstance(column, str) or not column:
        raise UserError(f"{where} ({name}): 'edges' needs 'bucketize', the numeric column "
                        "they cut")
    if (not isinstance(edges, list) or not edges
            or not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in edges)
            or not all(math.isfinite(e) for e in edges)):
        raise UserError(f"{where} ({name}): 'edges' must be a list of finite numbers")
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise UserError(f"{where} ({name}): 'edges' must increase")
    if hashed_or_raw:
        raise UserError(f"{where} ({name}): a bucketized feature's ids are its buckets: no "
                        "hash or ids = \"raw\"")
    if size != len(edges) + 1:
        raise UserError(f"{where} ({name}): {len(edges)} edges make {len(edges) + 1} buckets: "
                        f"set table_size = {len(edges) + 1}")
    return column, tuple(float(e) for e in edges)


# -- files --

def is_tabular(path: str) -> bool:
    p = Path(path)
    if p.is_file():
        return p.suffix.lower() in SUFFIXES
    return p.is_dir() and any(f.suffix.lower() in SUFFIXES for f in p.iterdir())


def list_files(path: str) -> list[Path]:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file or directory")
    files = ([p] if p.is_file() else
             sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES))
    if not files:
        raise UserError(f"{path}: no .parquet or .csv files")
    bad = [f for f in files if f.suffix.lower() not in SUFFIXES]
    if bad:
        raise UserError(f"{bad[0]}: --schema reads .parquet or .csv files")
    return files


def cache_dir(path: str, schema: TableSchema) -> Path:
    files = list_files(path)
    stamp = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = hashlib.sha1(json.dumps([stamp, schema.digest(), FORMAT_VERSION]).encode())
    return cache_root() / "tables" / f"{Path(path).name}-{key.hexdigest()[:16]}"


def convert(path: str, schema_path: str) -> Path:
    """The array directory holding `path` as `schema_path` describes it: converted on first
    use (one process converts, the others wait), then found again."""
    schema = TableSchema.load(schema_path)
    dest = cache_dir(path, schema)
    return built_once(dest, "meta.json", lambda tmp: build(tmp, path, schema))


def build(tmp: Path, path: str, schema: TableSchema) -> None:
    """Convert `path` into the array directory `tmp`."""
    writer = _Writer(tmp, schema)
    for f in list_files(path):
        if f.suffix.lower() == ".csv":
            _read_csv(f, schema, writer)
        else:
            _read_parquet(f, schema, writer)
    writer.close(path)


# -- checks of one batch --

class _Writer:
    def __init__(self, tmp: Path, schema: TableSchema) -> None:
        self.tmp, self.schema = tmp, schema
        self.labels = NpyWriter(tmp / "labels.npy", np.float32, ())
        self.dense = NpyWriter(tmp / "dense.npy", np.float32, (len(schema.dense),))
        self.cats = NpyWriter(tmp / "cats.npy", np.int64, (len(schema.categorical),))
        self.values = {m.name: NpyWriter(tmp / f"{m.name}.values.npy", np.int64, ())
                       for m in schema.multi_hot}
        self.weights = {m.name: NpyWriter(tmp / f"{m.name}.weights.npy", np.float32, ())
                        for m in schema.multi_hot if m.weights}
        self.offsets = {m.name: NpyWriter(tmp / f"{m.name}.offsets.npy", np.int64, ())
                        for m in schema.multi_hot}
        for w in self.offsets.values():
            w.append(np.zeros(1, np.int64))
        self.rows = 0
        self.ends = {m.name: 0 for m in schema.multi_hot}  # each multi-hot feature's ids so far
        # the largest id of each sparse column, and the first id past its table
        self.top: dict[str, int] = {}
        self.past: tuple[str, str, int, int] | None = None  # (where, column, id, size)

    def note_ids(self, column: Sparse, ids: np.ndarray, where_of: Where) -> None:
        """Ids of a column kept in a table of its own size (neither hashed nor raw): the
        largest, and the first past the table."""
        if not len(ids) or column.hash or column.raw or column.table_size is None:
            return
        self.top[column.name] = max(self.top.get(column.name, -1), int(ids.max()))
        if self.past is None:
            over = np.flatnonzero(ids >= column.table_size)
            if len(over):
                self.past = (where_of(int(over[0])), column.name, int(ids[over[0]]),
                             column.table_size)

    def close(self, path: str) -> None:
        if self.past is not None:
            where, name, value, size = self.past
            raise UserError(f"{where}: column '{name}': id {value} is past its table of "
                            f"{size:,} rows; set table_size = {self.top[name] + 1} for it in "
                            f"{self.schema.path} (or hash = true)")
        if self.rows == 0:
            raise UserError(f"{path}: no rows")
        for w in [self.labels, self.dense, self.cats, *self.values.values(),
                  *self.weights.values(), *self.offsets.values()]:
            w.close()
        (self.tmp / "features.json").write_text(json.dumps(self.schema.features(), indent=1))
        (self.tmp / "meta.json").write_text(json.dumps(
            {"format": "shadowsync-table", "version": FORMAT_VERSION, "source": str(path),
             "schema": self.schema.path, "rows": self.rows}, indent=1))


def _numbers(values: pyarrow.Array, where: Where, column: str, kind: str) -> np.ndarray:
    """A numeric or bool arrow array -> float64, a null named at its row."""
    pa = arrow()

    if values.null_count:
        raise UserError(f"{where(_first_null(values))}: column '{column}' ({kind}) is empty")
    if pa.types.is_boolean(values.type):
        return values.to_numpy(zero_copy_only=False).astype(np.float64)
    return values.to_numpy(zero_copy_only=False).astype(np.float64)


def _finite(values: pyarrow.Array, where: Where, column: str) -> np.ndarray:
    """A dense (numeric) column -> float64, a null or non-finite value named at its row."""
    v = _numbers(values, where, column, "dense")
    bad = np.flatnonzero(~np.isfinite(v))
    if len(bad):
        raise UserError(f"{where(int(bad[0]))}: column '{column}' (dense): {v[bad[0]]} is not "
                        "a finite number")
    return v


def _first_null(values: pyarrow.Array) -> int:
    return int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])


def _ids(values: pyarrow.Array, column: Sparse, where: Where) -> np.ndarray:
    """An integer or string arrow array of ids -> int64, checked: raw 64-bit ids
    (`raw_ids`) as they are (ids = "raw") or modulo the table (hash = true); else integers
    that must fit their table."""
    pa = arrow()

    t = values.type
    if not column.hash and not column.raw and not pa.types.is_integer(t):
        raise UserError(f"{where(0)}: column '{column.name}' holds strings; set hash = true "
                        "(or ids = \"raw\") for it in the schema (or give integer ids)")
    ids = raw_ids(values)
    if column.hash:
        return fold_words(ids, column.table_size)
    if column.raw:
        return ids
    bad = np.flatnonzero(ids < 0)  # negative, or an unsigned id past 2^63: past any table
    if len(bad):
        value = values[int(bad[0])].as_py()
        raise UserError(f"{where(int(bad[0]))}: column '{column.name}': "
                        + (f"negative id {value} (ids must be >= 0)" if value < 0 else
                           f"id {value} is past its table of {column.table_size:,} rows "
                           "(ids = \"raw\" takes raw 64-bit ids)"))
    return ids


def _type_ok(t: pyarrow.DataType, role: str, column: Sparse | None) -> bool:
    pa = arrow()

    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if role in ("label", "dense"):
        return numeric
    if role == "categorical":
        return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    if role == "multi-hot weights":
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        v = t.value_type
        return pa.types.is_integer(v) or pa.types.is_string(v) or pa.types.is_large_string(v)
    return False


EXPECTED = {"label": "0/1 numbers", "dense": "numbers", "categorical": "integer ids (or strings "
            "with hash = true)", "multi_hot": "lists of integer ids",
            "multi-hot weights": "lists of numbers"}


def _check_columns(f: Path, schema: TableSchema, arrow_schema: pyarrow.Schema) -> None:
    present = {field.name: field.type for field in arrow_schema}
    for name in schema.columns():
        role = schema.role(name)
        if name not in present:
            raise UserError(f"{f}: no column '{name}' (the schema {schema.path} names it as "
                            f"{role})")
        if not _type_ok(present[name], role, None):
            raise UserError(f"{f}: column '{name}' ({role}) is {present[name]}, expected "
                            f"{EXPECTED[role]}")


def _add_batch(batch: pyarrow.RecordBatch, schema: TableSchema, w: _Writer, f: Path, first_row: int,
               line_offset: int = 0) -> None:
    """One record batch: checked, appended to the writer. `first_row`: the batch's first row
    in its file, counted from 1."""
    n = batch.num_rows

    def where(i: int) -> str:
        return f"{f}:{first_row + i + line_offset}"

    cols = {name: batch.column(name) for name in batch.schema.names}
    y = _numbers(cols[schema.label], where, schema.label, "label")
    bad = np.flatnonzero(~((y >= 0) & (y <= 1)))
    if len(bad):
        raise UserError(f"{where(int(bad[0]))}: column '{schema.label}': label {y[bad[0]]} is not "
                        "in [0, 1]")
    dense = np.empty((n, len(schema.dense)), np.float32)
    for j, name in enumerate(schema.dense):
        dense[:, j] = _finite(cols[name], where, name)
    cats = np.empty((n, len(schema.categorical)), np.int64)
    for j, c in enumerate(schema.categorical):
        if c.bucketize:
            cats[:, j] = c.bucket_ids(_finite(cols[c.bucketize], where, c.bucketize))
            continue
        col = cols[c.name]
        if col.null_count:
            raise UserError(f"{where(_first_null(col))}: column '{c.name}' (categorical) is empty")
        ids = _ids(col, c, where)
        w.note_ids(c, ids, where)
        cats[:, j] = ids
    for m in schema.multi_hot:
        col = cols[m.name]
        lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = col.flatten()
        row_of = np.repeat(np.arange(n), lengths)
        if flat.null_count:
            raise UserError(f"{where(int(row_of[_first_null(flat)]))}: column '{m.name}' "
                            "(multi_hot): a null id in the list")
        ids = _ids(flat, m, lambda i, r=row_of: where(int(r[i]) if len(r) else 0))
        w.note_ids(m, ids, lambda i, r=row_of: where(int(r[i])))
        w.values[m.name].append(ids)
        if m.weights:
            wcol = cols[m.weights]
            wl = wcol.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
            diff = np.flatnonzero(wl != lengths)
            if len(diff):
                r = int(diff[0])
                raise UserError(f"{where(r)}: column '{m.weights}' has {int(wl[r])} weights for "
                                f"{int(lengths[r])} ids of '{m.name}'")
            wv = wcol.flatten()
            if wv.null_count:
                raise UserError(f"{where(int(row_of[_first_null(wv)]))}: column '{m.weights}': "
                                "a null weight")
            wv = wv.to_numpy(zero_copy_only=False).astype(np.float32)
            bad = np.flatnonzero(~np.isfinite(wv))
            if len(bad):
                raise UserError(f"{where(int(row_of[bad[0]]))}: column '{m.weights}': weight "
                                f"{wv[bad[0]]} is not a finite number")
            w.weights[m.name].append(wv)
        offs = w.ends[m.name] + np.cumsum(lengths)
        w.offsets[m.name].append(offs)
        w.ends[m.name] = int(offs[-1]) if n else w.ends[m.name]
    w.labels.append(y.astype(np.float32))
    w.dense.append(dense)
    w.cats.append(cats)
    w.rows += n


def _read_parquet(f: Path, schema: TableSchema, w: _Writer) -> None:
    pq = arrow().parquet

    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors for a file that is not Parquet
        raise UserError(f"{f}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    _check_columns(f, schema, pf.schema_arrow)
    row = 1
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=schema.columns()):
        _add_batch(batch, schema, w, f, row)
        row += batch.num_rows


def _read_csv(f: Path, schema: TableSchema, w: _Writer) -> None:
    pa = arrow()
    pc, pcsv = pa.compute, pa.csv

    types: dict[str, object] = {schema.label: pa.float64()}
    types.update({d: pa.float64() for d in schema.dense})
    types.update({c.name: pa.string() if c.hash or c.raw else pa.int64() for c in schema.categorical
                  if not c.bucketize})
    types.update({c.bucketize: pa.float64() for c in schema.categorical if c.bucketize})
    types.update({m.name: pa.string() for m in schema.multi_hot})
    types.update({m.weights: pa.string() for m in schema.multi_hot if m.weights})
    try:
        header = pcsv.open_csv(f, read_options=pcsv.ReadOptions(block_size=1 << 20))
    except (pa.ArrowInvalid, OSError) as e:
        raise unreadable_csv(f, str(e)) from None
    present = set(header.schema.names)
    for name in schema.columns():
        if name not in present:
            raise UserError(f"{f}: no column '{name}' (the schema {schema.path} names it as "
                            f"{schema.role(name)})")
    try:
        reader = pcsv.open_csv(
            f, read_options=pcsv.ReadOptions(block_size=1 << 22),
            convert_options=pcsv.ConvertOptions(column_types=types,
                                                include_columns=schema.columns(),
                                                strings_can_be_null=False))
    except pa.ArrowInvalid as e:  # the first block is read on opening
        raise _csv_error(f, schema, types, str(e)) from None
    row = 1
    integers: dict[str, bool] = {}  # a raw column's kind, from its first batch
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as e:
            raise _csv_error(f, schema, types, str(e)) from None
        arrays, names = [], []
        for name in batch.schema.names:
            col = batch.column(name)
            m = next((m for m in schema.multi_hot if name in (m.name, m.weights)), None)
            if any(c.raw and c.name == name for c in schema.categorical):
                col = _raw_text(col, name, integers, lambda i, r=row: f"{f}:{r + i + 1}")
            elif m is not None and m.raw and name == m.name:
                parts = pc.split_pattern(col, m.separator)
                parts = pc.if_else(pc.equal(col, ""), pa.scalar([], pa.list_(pa.string())),
                                   parts)
                row_of = np.repeat(np.arange(len(parts)), parts.value_lengths().to_numpy(
                    zero_copy_only=False))
                col = pa.ListArray.from_arrays(parts.offsets, _raw_text(
                    parts.flatten(), name, integers,
                    lambda i, r=row, at=row_of: f"{f}:{r + at[i] + 1}"))
            elif m is not None:
                sep = m.separator
                parts = pc.split_pattern(col, sep)
                empty = pc.equal(col, "")
                parts = pc.if_else(empty, pa.scalar([], pa.list_(pa.string())), parts)
                target = (pa.list_(pa.float32()) if name == m.weights else
                          pa.list_(pa.string()) if m.hash else pa.list_(pa.int64()))
                try:
                    col = parts.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    bad = _first_bad(parts, target.value_type)
                    what = "numbers" if name == m.weights else "integer ids"
                    raise UserError(f"{f}:{row + bad + 1}: column '{name}': "
                                    f"{col[bad].as_py()!r} is not a '{sep}'-separated list "
                                    f"of {what}") from None
            arrays.append(col)
            names.append(name)
        _add_batch(pa.RecordBatch.from_arrays(arrays, names=names), schema, w, f, row,
                   line_offset=1)
        row += batch.num_rows


def _raw_text(col: pyarrow.Array, name: str, integers: dict[str, bool], where: Where
              ) -> pyarrow.Array:
    """A raw column's CSV text: integer ids when its first batch holds integers alone (then
    every batch must), else strings (hashed by `raw_ids` as they are)."""
    pa = arrow()

    try:
        as_ints = col.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        as_ints = None
    if as_ints is not None:
        integers.setdefault(name, True)
        return as_ints if integers[name] else col
    texts = col.to_pylist()
    words: list[int] = []
    for i, text in enumerate(texts):  # past int64 (uint64 hashes), or not integers
        try:
            value = int(text)
        except ValueError:
            break
        if not -(1 << 63) <= value < 1 << 64:
            raise UserError(f"{where(i)}: column '{name}': id {text} does not fit 64 bits")
        words.append(value)
    whole = len(words) == len(texts)
    integers.setdefault(name, whole)
    if not integers[name]:
        return col
    if not whole:
        raise UserError(f"{where(len(words))}: column '{name}': {texts[len(words)]!r} is not "
                        "an integer id (the column's first rows are integers)")
    return pa.array(raw_ids(words), pa.int64())


def _first_bad(parts: pyarrow.Array, value_type: pyarrow.DataType | str) -> int:
    for i, items in enumerate(parts.to_pylist()):
        for v in items or []:
            try:
                float(v) if value_type != "int64" and "int" not in str(value_type) else int(v)
            except ValueError:
                return i
    return 0


def unreadable_csv(f: Path, message: str) -> UserError:
    """A CSV file pyarrow cannot parse, in one line; a row of another number of fields than
    the header named by its line (pyarrow names the row's text, not where it is)."""
    ragged = re.search(r"Expected (\d+) columns, got (\d+)", message)
    if ragged:
        with open(f, newline="", encoding="utf-8", errors="replace") as lines:
            for line, row in enumerate(csv.reader(lines), start=1):
                if row and len(row) != int(ragged[1]):
                    return UserError(f"{f}:{line}: {len(row)} fields, but the header has "
                                     f"{ragged[1]}")
    return UserError(f"{f}: not a readable CSV file ({message.splitlines()[0]})")


def _csv_error(f: Path, schema: TableSchema, types: dict[str, object], message: str) -> UserError:
    """pyarrow names the column but not the row of a value it cannot convert: find it."""
    pa = arrow()
    pcsv = pa.csv

    if "CSV parse error" in message:
        return unreadable_csv(f, message)

    names = [n for n in schema.columns() if f"'{n}'" in message] or \
        [n for n in schema.columns() if types.get(n) != pa.string()]
    as_text = pcsv.open_csv(f, convert_options=pcsv.ConvertOptions(
        column_types={n: pa.string() for n in names}, include_columns=names))
    row = 1
    for batch in as_text:
        for name in names:
            for i, text in enumerate(batch.column(name).to_pylist()):
                try:
                    v = float(text) if types[name] == pa.float64() else int(text)
                    if isinstance(v, float) and math.isnan(v):
                        raise ValueError
                except (TypeError, ValueError):
                    role = schema.role(name)
                    what = "an integer id" if types[name] == pa.int64() else "a number"
                    return UserError(f"{f}:{row + i + 1}: column '{name}' ({role}): {text!r} is "
                                     f"not {what}")
        row += batch.num_rows
    return UserError(f"{f}: {message.splitlines()[0]}")
