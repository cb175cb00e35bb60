"""Opening CTR data through its source (`shadowsync.data.sources`: synthetic, ``.npy``
arrays, Criteo TSV, Parquet / CSV) and cutting it into batches.

Every process of a run opens the same data: the first one converts (or generates) it into
a cache of ``.npy`` files, the others wait for it and map the same files, so the rows live
in the page cache once however many workers read them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from shadowsync.data.arrays import declared, is_array_dir
from shadowsync.data.bags import Bags
from shadowsync.data.ctr_data import CtrData, layout
from shadowsync.data.ids import fold_words
from shadowsync.data.sources import SYNTHETIC, source_of
from shadowsync.errors import UserError

DEFAULT_TABLE_SIZE = 100_000

__all__ = ["SYNTHETIC", "Batch", "CtrData", "EpochOrder", "batch_of", "batches",
           "check_ids", "dense_features", "feature_counts", "layout", "num_batches", "open_data",
           "predict_rows", "resolve", "sparse_features", "sparse_layout", "table_rows_of"]


class Batch(NamedTuple):
    """One batch of rows, as every source's rows are cut: what a worker's step reads."""

    dense: torch.Tensor  # [B, D] float32
    ids: torch.Tensor | Bags  # [B, T] int64 table rows, or the single ids and multi-hot bags
    labels: torch.Tensor  # [B] float32


def open_data(
    path: str, *, skip_bad_lines: bool = False, examples: int | None = None, seed: int = 0
) -> CtrData:
    """The rows at ``path``, read by its source (`shadowsync.data.sources`): ``"synthetic"``
    (``examples`` rows of the planted teacher built from ``seed``, default 1,000,000), a
    directory of ``.npy`` arrays (see ``shadowsync.data.arrays``) or Criteo TSV (file, .gz
    or directory of them).

    For files, ``examples`` keeps only the first rows and ``seed`` is unused. Every kind is
    cached on first use; raises UserError on bad input.
    """
    if examples is not None and examples < 1:
        raise UserError(f"examples must be positive, got {examples}")
    return source_of(path).open(path, examples=examples, seed=seed,
                                skip_bad_lines=skip_bad_lines)


def is_generated(path: str, schema: str | None = None) -> bool:
    """Whether the rows of `path` are generated from a count and a seed (`DataSource`)."""
    return source_of(path, schema).generated


def resolve(path: str, schema: str | None) -> str:
    """Where rows of `path` are read from: with a schema, the array directory its Parquet or
    CSV files convert into (once, cached; see ``shadowsync.data.tabular``)."""
    return source_of(path, schema).resolve(path, schema)


def feature_counts(path: str) -> tuple[int, int]:
    """(dense features D, categorical features T) of the data at ``path``, without reading
    or converting its rows: what the model and the embedding tables are sized by."""
    return source_of(path).feature_counts(path)


def table_rows_of(path: str, num_tables: int, given: Callable[[int], list[int]],
                  sizes_given: list[int] | None = None, where: str = "") -> tuple[int, ...]:
    """Table sizes: those the data declares (a schema, an array directory's features.json),
    else `given(T)` (--table-size; where it sizes some tables, `given` sizes the others).
    `sizes_given`: --table-size where it is not the default, refused when it differs from
    what the data (`where`, the file the user named) declares rather than silently ignored."""
    declared = source_of(path).declared_table_rows(path)
    if declared is None:
        return tuple(given(num_tables))
    if None in declared:  # --table-size sizes the tables the data gives no size
        rest = iter(given(declared.count(None)))
        return tuple(next(rest) if size is None else size for size in declared)
    if sizes_given is not None and list(sizes_given) != list(declared) and not (
            len(sizes_given) == 1 and set(declared) == set(sizes_given)):
        raise UserError(f"--table-size: {where or path} declares its tables' sizes "
                        f"({', '.join(map(str, declared))}); set them there, not with "
                        "--table-size")
    return tuple(declared)


def sparse_features(path: str, num_tables: int) -> list[dict[str, object]]:
    """Each table's feature, in the tables' order, from the files' headers: its name (an
    array directory's features.json names, else C1..CT as Criteo names its fields), whether it
    is multi-hot, and then its pooling and weighting. What a checkpoint's manifest records."""
    return source_of(path).sparse_features(path, num_tables)


def dense_features(path: str, num_dense: int) -> list[str]:
    """The dense columns' names: an array directory's features.json (as a schema's
    conversion writes it), else I1..ID as Criteo names its integer fields. What a checkpoint's
    manifest records, so that a loaded model reads raw rows by name."""
    named = (declared(path) or {}).get("dense") if is_array_dir(path) else None
    if (isinstance(named, list) and len(named) == num_dense
            and all(isinstance(n, str) for n in named)):
        return list(named)
    return [f"I{i + 1}" for i in range(num_dense)]


def sparse_layout(path: str) -> str:
    """`CtrData.sparse_layout` of the data at ``path``, from the files' headers only."""
    features = sparse_features(path, feature_counts(path)[1])
    return layout(sum(not f["multi_hot"] for f in features),
                  [(f["name"], f["weighted"], f["pooling"]) for f in features if f["multi_hot"]])


def check_ids(data: CtrData, table_rows: tuple[int, ...]) -> None:
    """Every id of `data` within its table (`table_rows`), or one line saying which is not."""
    source_of(data.source).check_ids(data, table_rows)


def num_batches(start: int, stop: int, batch_size: int, drop_last: bool = False) -> int:
    """Global batches over rows [start, stop)."""
    rows = max(stop - start, 0)
    return rows // batch_size if drop_last else math.ceil(rows / batch_size)


class EpochOrder:
    """Passes over the first ``rows`` rows, each in its own seeded random order.

    Training over several epochs reads logical rows [0, epochs x rows): logical row ``r``
    is row ``perm_e[r % rows]`` of the data, where ``e = r // rows`` and ``perm_e`` is a
    permutation drawn from ``(seed, e)``. Every process draws the same permutations, so the
    shards of one pass still never overlap, and a position (steps into the logical rows)
    resumes at the same row.
    """

    def __init__(self, rows: int, seed: int) -> None:
        if rows < 1:
            raise ValueError("an epoch needs at least one row")
        self.rows, self.seed = rows, seed
        self._cached: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._cached:
            if len(self._cached) >= 2:  # a batch spans at most two passes
                self._cached.pop(min(self._cached))
            rng = np.random.default_rng([self.seed, epoch, 0x5EED])
            self._cached[epoch] = rng.permutation(self.rows)
        return self._cached[epoch]

    def rows_of(self, lo: int, hi: int) -> np.ndarray:
        """Data rows of logical rows [lo, hi)."""
        logical = np.arange(lo, hi, dtype=np.int64)
        epoch, within = np.divmod(logical, self.rows)
        out = np.empty(len(logical), dtype=np.int64)
        for e in np.unique(epoch):
            mask = epoch == e
            out[mask] = self.permutation(int(e))[within[mask]]
        return out


def batches(
    data: CtrData,
    start: int,
    stop: int,
    batch_size: int,
    shard: int = 0,
    num_shards: int = 1,
    table_size: int | Sequence[int] = DEFAULT_TABLE_SIZE,
    drop_last: bool = False,
    skip: int = 0,
    order: EpochOrder | None = None,
) -> Iterator[Batch]:
    """One pass of `Batch` ``(dense [B, D] float32, ids [B, T] int64, labels [B] float32)``.

    Rows [start, stop) form global batches of ``batch_size`` consecutive rows; batch ``b``
    belongs to shard ``b % num_shards``, so shards never overlap and together read every row
    once. ``ids`` are the raw hashes modulo the table size (one for all tables or one per
    table; taken as unsigned 64-bit numbers, as ``int(hex, 16) % table_size`` would).
    ``drop_last`` drops a short final batch; ``skip`` skips the shard's first batches (a
    resumed run starts where its checkpoint says the shard was). With ``order``, [start, stop)
    are logical rows of several shuffled passes (see ``EpochOrder``).
    """
    sizes = np.atleast_1d(np.asarray(table_size, dtype=np.int64))
    if batch_size < 1 or (sizes < 0).any():
        raise ValueError("batch_size must be positive and table sizes >= 0 (0: raw ids)")
    if len(sizes) not in (1, data.num_tables):
        raise ValueError(f"{len(sizes)} table sizes for {data.num_tables} tables")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not in [0, {num_shards})")
    if not 0 <= start <= stop <= (len(data) if order is None else math.inf):
        raise ValueError(f"rows [{start}, {stop}) are not within [0, {len(data)})")
    modulus = sizes.astype(np.uint64)
    total = num_batches(start, stop, batch_size, drop_last)
    for b in range(shard + skip * num_shards, total, num_shards):
        lo = start + b * batch_size
        hi = min(lo + batch_size, stop)
        rows: slice | np.ndarray = slice(lo, hi) if order is None else order.rows_of(lo, hi)
        yield batch_of(data, rows, modulus)


def batch_of(data: CtrData, rows: slice | np.ndarray, modulus: np.ndarray) -> Batch:
    """``(dense, ids, labels)`` of the rows ``rows`` picks (consecutive rows, or any row
    numbers), ids reduced modulo ``modulus`` (uint64, one for all tables or one per table).

    ``ids`` is a tensor [B, T] when every feature has one id per row, else `Bags`: the
    single ids and each multi-hot feature's ids, for the tables to look up and pool.
    """
    # Copies out of the (read-only) memory map, so the tensors own writable memory.
    dense = np.array(data.dense[rows], dtype=np.float32)
    # int64 hashes are reinterpreted as unsigned; narrower ids (checked >= 0) are widened.
    cats = np.asarray(data.cats[rows], dtype=np.int64)
    single = cats.shape[1]
    ids = torch.from_numpy(fold_words(cats, modulus[:single or 1]))
    labels = np.array(data.labels[rows], dtype=np.float32)
    if data.multi_hot:
        last = len(modulus) - 1
        ids = Bags.build(ids, [f.batch(rows, int(modulus[min(single + m, last)]))
                               for m, f in enumerate(data.multi_hot)])
    return Batch(torch.from_numpy(dense), ids, torch.from_numpy(labels))


def predict_rows(data: CtrData, start: int, stop: int, table_size: int | Sequence[int],
                 probabilities: Callable[[torch.Tensor, torch.Tensor | Bags], torch.Tensor],
                 batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Predictions and labels of rows [start, stop): `probabilities(dense, ids)` of each
    batch, as `batches` cuts them, without gradients."""
    preds, labels = [], []
    with torch.no_grad():
        for dense, ids, y in batches(data, start, stop, batch_size, table_size=table_size):
            preds.append(probabilities(dense, ids).numpy())
            labels.append(y.numpy())
    return np.concatenate(preds), np.concatenate(labels)
