"""`CtrData`: the rows every data source opens into, whatever the format they came from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shadowsync.data.jagged import Jagged
from shadowsync.metrics.ctr import normalized_entropy


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


def layout(single: int, multi: Sequence[tuple[str, bool, str]]) -> str:
    """How a model's ids are pooled, in words: its single-id count, then each multi-hot
    feature's (name, weighted, pooling)."""
    named = [f"{name} ({'weighted ' if weighted else ''}{pooling})"
             for name, weighted, pooling in multi]
    return ", ".join([f"{single} single-id", *named])
