"""Opening CTR data (synthetic, Criteo TSV or ``.npy`` arrays) and cutting it into batches.

Every process of a run opens the same data: the first one converts (or generates) it into
a cache of ``.npy`` files, the others wait for it and map the same files, so the rows live
in the page cache once however many workers read them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shadowsync.data import arrays, criteo, synth, tabular
from shadowsync.data.bags import Bags
from shadowsync.data.cache import built_once, cache_root
from shadowsync.data.jagged import Jagged
from shadowsync.data.schema import NUM_CAT, NUM_DENSE
from shadowsync.errors import UserError
from shadowsync.metrics.ctr import binary_entropy, normalized_entropy

SYNTHETIC = "synthetic"
DEFAULT_SYNTHETIC_EXAMPLES = 1_000_000
DEFAULT_TABLE_SIZE = 100_000


class CtrData:
    """Rows of CTR examples: labels [n], dense features [n, D], raw ids or hashes [n, T].

    Criteo and synthetic data have D = 13 (log-transformed counts) and T = 26; arrays given
    by the user have their own D and T, and may add ``multi_hot`` features (several ids per
    row, `Jagged`), whose tables come after the T of ``cats``.

    Arrays are usually read-only memory maps of a cache. ``probs`` holds the true click
    probabilities when the data is synthetic; ``teacher_ne_hint`` is the teacher's NE read
    from a ``teacher.json`` beside TSV files that the generator wrote.
    """

    def __init__(
        self,
        labels: np.ndarray,
        dense: np.ndarray,
        cats: np.ndarray,
        *,
        source: str,
        skipped_lines: int = 0,
        probs: np.ndarray | None = None,
        teacher_ne_hint: float | None = None,
        multi_hot: Sequence[Jagged] = (),
    ) -> None:
        n = len(labels)
        if dense.ndim != 2 or cats.ndim != 2 or len(dense) != n or len(cats) != n:
            raise ValueError(
                f"inconsistent shapes: labels {labels.shape}, dense {dense.shape}, "
                f"cats {cats.shape}"
            )
        if probs is not None and probs.shape != (n,):
            raise ValueError(f"probs shape {probs.shape} does not match {n} rows")
        if any(len(feature) != n for feature in multi_hot):
            raise ValueError(f"multi-hot features of {[len(f) for f in multi_hot]} rows, not {n}")
        self.multi_hot = tuple(multi_hot)
        self.labels = labels
        self.dense = dense
        self.cats = cats
        self.probs = probs
        self.source = source
        self.skipped_lines = skipped_lines
        self.teacher_ne_hint = teacher_ne_hint

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_dense(self) -> int:
        return self.dense.shape[1]

    @property
    def num_tables(self) -> int:
        """Embedding tables: the single-id columns of ``cats``, then the multi-hot features."""
        return self.cats.shape[1] + len(self.multi_hot)

    def sparse_layout(self) -> str:
        """How the ids are pooled, which a model trained on other data must share: the single-id
        columns, then each multi-hot feature's name, pooling and weighting."""
        return layout(self.cats.shape[1],
                      [(f.name, f.weights is not None, f.pooling) for f in self.multi_hot])

    def __repr__(self) -> str:
        return f"CtrData({self.source!r}, rows={len(self)}, skipped_lines={self.skipped_lines})"

    def teacher_ne(self, start: int = 0, stop: int | None = None) -> float | None:
        """The teacher's NE on rows [start, stop) when true probabilities are known."""
        if self.probs is None:
            return None
        return normalized_entropy(self.probs[start:stop], self.labels[start:stop])

    def head(self, rows: int) -> CtrData:
        """The first ``rows`` rows (a view, no copy)."""
        return CtrData(
            self.labels[:rows],
            self.dense[:rows],
            self.cats[:rows],
            source=self.source,
            skipped_lines=self.skipped_lines,
            probs=None if self.probs is None else self.probs[:rows],
            teacher_ne_hint=self.teacher_ne_hint if rows >= len(self) else None,
            multi_hot=[feature.head(rows) for feature in self.multi_hot],
        )


def open_data(
    path: str, *, skip_bad_lines: bool = False, examples: int | None = None, seed: int = 0
) -> CtrData:
    """Open ``"synthetic"`` (``examples`` rows of the planted teacher built from ``seed``,
    default 1,000,000), a directory of ``.npy`` arrays (see ``shadowsync.data.arrays``) or
    Criteo TSV at ``path`` (file, .gz or directory of them).

    For files, ``examples`` keeps only the first rows and ``seed`` is unused. Both kinds
    are cached on first use (see ``shadowsync.data.criteo``); raises UserError on bad input.
    """
    if examples is not None and examples < 1:
        raise UserError(f"examples must be positive, got {examples}")
    if path == SYNTHETIC:
        return _open_synthetic(examples or DEFAULT_SYNTHETIC_EXAMPLES, seed)
    if arrays.is_array_dir(path):
        labels, dense, cats = arrays.load(path)
        data = CtrData(labels, dense, cats, source=path,
                       multi_hot=arrays.load_multi_hot(path, len(labels)))
        return data if examples is None else data.head(examples)
    parsed = criteo.load(path, skip_bad_lines=skip_bad_lines)
    data = CtrData(
        parsed.labels,
        parsed.dense,
        parsed.cats,
        source=path,
        skipped_lines=parsed.skipped_lines,
        teacher_ne_hint=_teacher_hint(path),
    )
    return data if examples is None else data.head(examples)


def sparse_layout(path: str) -> str:
    """`CtrData.sparse_layout` of the data at ``path``, from the files' headers only."""
    if path == SYNTHETIC or not arrays.is_array_dir(path):
        return layout(NUM_CAT, [])
    specs = arrays.multi_hot_specs(path)
    return layout(arrays.shapes(path)[1] - len(specs),
                  [(s["name"], s["weighted"], s["pooling"]) for s in specs])


def sparse_features(path: str, num_tables: int) -> list[dict[str, Any]]:
    """Each table's feature, in the tables' order, from the files' headers: its name (an
    array directory's features.json names, else C1..CT as Criteo names its fields), whether it
    is multi-hot, and then its pooling and weighting. What a checkpoint's manifest records."""
    specs = arrays.multi_hot_specs(path) if arrays.is_array_dir(path) else []
    single = num_tables - len(specs)
    doc = arrays.declared(path) if arrays.is_array_dir(path) else None
    named = (doc or {}).get("categorical", [])
    names = [f"C{i + 1}" for i in range(single)]
    if (isinstance(named, list) and len(named) == single
            and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in named)):
        names = [c["name"] for c in named]
    return [*({"name": name, "multi_hot": False} for name in names),
            *({"name": s["name"], "multi_hot": True, "pooling": s["pooling"],
               "weighted": s["weighted"]} for s in specs)]


def layout(single: int, multi: Sequence[tuple[str, bool, str]]) -> str:
    """How a model's ids are pooled, in words: its single-id count, then each multi-hot
    feature's (name, weighted, pooling)."""
    named = [f"{name} ({'weighted ' if weighted else ''}{pooling})"
             for name, weighted, pooling in multi]
    return ", ".join([f"{single} single-id", *named])


def resolve(path: str, schema: str | None) -> str:
    """Where rows of `path` are read from: with a schema, the array directory its Parquet or
    CSV files convert into (once, cached; see ``shadowsync.data.tabular``)."""
    if schema is not None and path != SYNTHETIC:
        return str(tabular.convert(path, schema))
    if Path(path).suffix.lower() in tabular.SUFFIXES:
        raise UserError(f"{path}: Parquet and CSV data needs --schema naming its columns "
                        "(see docs/real-data.md)")
    return path


def table_rows_of(path: str, num_tables: int, given: Any) -> tuple[int, ...]:
    """Table sizes: those an array directory declares (features.json), else `given(T)`
    (--table-size)."""
    declared = arrays.declared_table_rows(path) if (
        path != SYNTHETIC and arrays.is_array_dir(path)) else None
    return tuple(declared if declared is not None else given(num_tables))


def feature_counts(path: str) -> tuple[int, int]:
    """(dense features D, categorical features T) of the data at ``path``, without reading
    or converting its rows: what the model and the embedding tables are sized by."""
    if path != SYNTHETIC and arrays.is_array_dir(path):
        return arrays.shapes(path)
    return NUM_DENSE, NUM_CAT


def synthetic_cache_dir(examples: int, seed: int) -> Path:
    return cache_root() / f"synth-{examples}-{seed}-v{synth.SYNTH_VERSION}"


def _open_synthetic(examples: int, seed: int) -> CtrData:
    def build(tmp: Path) -> None:
        data = synth.generate(examples, seed)
        for name in ("labels", "dense", "cats", "probs"):
            np.save(tmp / f"{name}.npy", getattr(data, name))
        meta = {
            "generator": "shadowsync planted teacher",
            "version": synth.SYNTH_VERSION,
            "examples": examples,
            "seed": seed,
            "mean_ctr": data.mean_ctr,
            "teacher_ne": data.teacher_ne(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    cache = built_once(synthetic_cache_dir(examples, seed), "meta.json", build)
    cached = {n: np.load(cache / f"{n}.npy", mmap_mode="r") for n in ("labels", "dense", "cats")}
    return CtrData(
        cached["labels"],
        cached["dense"],
        cached["cats"],
        source=SYNTHETIC,
        probs=np.load(cache / "probs.npy", mmap_mode="r"),
    )


def _teacher_hint(path: str) -> float | None:
    """Teacher NE from a ``teacher.json`` written by ``synth.write_tsv_dataset``, if any.

    For a directory of several listed files the NE is pooled from their log losses and
    click rates; any data file the summary does not list means no hint.
    """
    p = Path(path)
    summary = (p if p.is_dir() else p.parent) / "teacher.json"
    try:
        listed = json.loads(summary.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    names = [real.name for real, _ in criteo.list_sources(path)]
    if not names or any(name not in listed for name in names):
        return None
    entries = [listed[name] for name in names]
    if len(entries) == 1:
        ne = entries[0].get("ne")
        return float(ne) if ne is not None else None
    try:
        rows = sum(e["examples"] for e in entries)
        loss = sum(e["logloss"] * e["examples"] for e in entries) / rows
        ctr = sum(e["mean_ctr"] * e["examples"] for e in entries) / rows
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    h = binary_entropy(ctr)
    return loss / h if h > 0 else None


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
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One pass of ``(dense [B, D] float32, ids [B, T] int64, labels [B] float32)``.

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


def fold_ids(ids: np.ndarray, modulus: np.ndarray) -> np.ndarray:
    """uint64 ids modulo their table's size; a size of 0 leaves a table's ids raw (dynamic
    tables map raw ids to rows themselves)."""
    if modulus.all():
        return ids % modulus
    return np.where(modulus == 0, ids, ids % np.maximum(modulus, 1))


def batch_of(data: CtrData, rows: slice | np.ndarray, modulus: np.ndarray
             ) -> tuple[torch.Tensor, torch.Tensor | Bags, torch.Tensor]:
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
    ids = torch.from_numpy(fold_ids(cats.view(np.uint64), modulus[:single or 1]).view(np.int64))
    labels = np.array(data.labels[rows], dtype=np.float32)
    if data.multi_hot:
        last = len(modulus) - 1
        ids = Bags.build(ids, [f.batch(rows, int(modulus[min(single + m, last)]))
                               for m, f in enumerate(data.multi_hot)])
    return torch.from_numpy(dense), ids, torch.from_numpy(labels)


def predict_rows(data: CtrData, start: int, stop: int, table_size: int | Sequence[int],
                 probabilities: Callable[[torch.Tensor, Any], torch.Tensor],
                 batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Predictions and labels of rows [start, stop): `probabilities(dense, ids)` of each
    batch, as `batches` cuts them, without gradients."""
    preds, labels = [], []
    with torch.no_grad():
        for dense, ids, y in batches(data, start, stop, batch_size, table_size=table_size):
            preds.append(probabilities(dense, ids).numpy())
            labels.append(y.numpy())
    return np.concatenate(preds), np.concatenate(labels)
