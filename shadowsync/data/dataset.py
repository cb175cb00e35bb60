"""Opening CTR data (synthetic or Criteo TSV) and cutting it into batches for workers.

Every process of a run opens the same data: the first one converts (or generates) it into
a cache of ``.npy`` files, the others wait for it and map the same files, so the rows live
in the page cache once however many workers read them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from shadowsync.data import criteo, synth
from shadowsync.errors import UserError
from shadowsync.metrics.ctr import binary_entropy, normalized_entropy

SYNTHETIC = "synthetic"
DEFAULT_SYNTHETIC_EXAMPLES = 1_000_000
DEFAULT_TABLE_SIZE = 100_000


class CtrData:
    """Rows of CTR examples: labels [n], log-transformed dense [n, 13], raw hashes [n, 26].

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
    ) -> None:
        n = len(labels)
        if dense.shape != (n, criteo.NUM_DENSE) or cats.shape != (n, criteo.NUM_CAT):
            raise ValueError(
                f"inconsistent shapes: labels {labels.shape}, dense {dense.shape}, "
                f"cats {cats.shape}"
            )
        if probs is not None and probs.shape != (n,):
            raise ValueError(f"probs shape {probs.shape} does not match {n} rows")
        self.labels = labels
        self.dense = dense
        self.cats = cats
        self.probs = probs
        self.source = source
        self.skipped_lines = skipped_lines
        self.teacher_ne_hint = teacher_ne_hint

    def __len__(self) -> int:
        return len(self.labels)

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
        )


def open_data(
    path: str, *, skip_bad_lines: bool = False, examples: int | None = None, seed: int = 0
) -> CtrData:
    """Open ``"synthetic"`` (``examples`` rows of the planted teacher built from ``seed``,
    default 1,000,000) or Criteo TSV at ``path`` (file, .gz or directory of them).

    For files, ``examples`` keeps only the first rows and ``seed`` is unused. Both kinds
    are cached on first use (see ``shadowsync.data.criteo``); raises UserError on bad input.
    """
    if examples is not None and examples < 1:
        raise UserError(f"examples must be positive, got {examples}")
    if path == SYNTHETIC:
        return _open_synthetic(examples or DEFAULT_SYNTHETIC_EXAMPLES, seed)
    arrays = criteo.load(path, skip_bad_lines=skip_bad_lines)
    data = CtrData(
        arrays.labels,
        arrays.dense,
        arrays.cats,
        source=path,
        skipped_lines=arrays.skipped_lines,
        teacher_ne_hint=_teacher_hint(path),
    )
    return data if examples is None else data.head(examples)


def synthetic_cache_dir(examples: int, seed: int) -> Path:
    return criteo.cache_root() / f"synth-{examples}-{seed}-v{synth.SYNTH_VERSION}"


def _open_synthetic(examples: int, seed: int) -> CtrData:
    cache = synthetic_cache_dir(examples, seed)
    meta_file = cache / "meta.json"
    if not meta_file.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with criteo.build_lock(cache):
            if not meta_file.exists():

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

                criteo.publish_dir(build, cache)
    arrays = {n: np.load(cache / f"{n}.npy", mmap_mode="r") for n in ("labels", "dense", "cats")}
    return CtrData(
        arrays["labels"],
        arrays["dense"],
        arrays["cats"],
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


def batches(
    data: CtrData,
    start: int,
    stop: int,
    batch_size: int,
    shard: int = 0,
    num_shards: int = 1,
    table_size: int = DEFAULT_TABLE_SIZE,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One pass of ``(dense [B,13] float32, ids [B,26] int64, labels [B] float32)``.

    Rows [start, stop) form global batches of ``batch_size`` consecutive rows; batch ``b``
    belongs to shard ``b % num_shards``, so shards never overlap and together read every row
    once. ``ids`` are the raw hashes modulo ``table_size`` (taken as unsigned 64-bit
    numbers, as ``int(hex, 16) % table_size`` would). ``drop_last`` drops a short final
    batch.
    """
    if batch_size < 1 or table_size < 1:
        raise ValueError("batch_size and table_size must be positive")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not in [0, {num_shards})")
    if not 0 <= start <= stop <= len(data):
        raise ValueError(f"rows [{start}, {stop}) are not within [0, {len(data)})")
    modulus = np.uint64(table_size)
    total = num_batches(start, stop, batch_size, drop_last)
    for b in range(shard, total, num_shards):
        lo = start + b * batch_size
        hi = min(lo + batch_size, stop)
        # Copies out of the (read-only) memory map, so the tensors own writable memory.
        dense = np.array(data.dense[lo:hi], dtype=np.float32)
        ids = (np.asarray(data.cats[lo:hi]).view(np.uint64) % modulus).view(np.int64)
        labels = np.array(data.labels[lo:hi], dtype=np.float32)
        yield torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(labels)
