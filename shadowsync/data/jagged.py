"""One multi-hot feature over all rows: a variable number of ids per row, optionally weighted.

Laid out as TorchRec's KeyedJaggedTensor lays out one key: row i's ids are
``values[offsets[i]:offsets[i + 1]]`` (and their weights the same slice of ``weights``), so
``offsets`` has one entry more than there are rows, starts at 0 and ends at ``len(values)``.
The arrays may be read-only memory maps; cutting rows out copies only those rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shadowsync.data.ids import fold_words


@dataclass(frozen=True)
class Jagged:
    name: str
    values: np.ndarray  # [nnz] integer ids
    offsets: np.ndarray  # [rows + 1] int64, non-decreasing, 0 .. nnz
    weights: np.ndarray | None  # [nnz] float32, or None: every id counts once
    pooling: str = "sum"  # "sum" or "mean" of the row's (weighted) vectors

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def head(self, rows: int) -> Jagged:
        """The first ``rows`` rows (views, no copy)."""
        end = int(self.offsets[rows])
        return Jagged(self.name, self.values[:end], self.offsets[:rows + 1],
                      None if self.weights is None else self.weights[:end], self.pooling)

    def rows(self, index: slice | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(values, offsets from 0, weights) of the rows ``index`` picks: a slice of
        consecutive rows (step 1), or any row numbers in any order, repeats allowed."""
        if isinstance(index, slice):
            lo, hi, _ = index.indices(len(self))
            hi = max(lo, hi)
            start, stop = int(self.offsets[lo]), int(self.offsets[hi])
            offsets = np.asarray(self.offsets[lo:hi + 1], dtype=np.int64) - start
            take: slice | np.ndarray = slice(start, stop)
        else:
            index = np.asarray(index, dtype=np.int64)
            starts = np.asarray(self.offsets[index], dtype=np.int64)
            lengths = np.asarray(self.offsets[index + 1], dtype=np.int64) - starts
            offsets = np.zeros(len(index) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            # Position of each picked id in `values`: its row's start, plus its rank in the row.
            take = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        values = np.asarray(self.values[take], dtype=np.int64)
        weights = None if self.weights is None else np.array(self.weights[take], np.float32)
        return values, offsets, weights

    def batch(self, index: slice | np.ndarray, modulus: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, str]:
        """The rows' (values modulo the table's rows, offsets, weights, pooling) as tensors,
        what `Bags.build` takes."""
        values, offsets, weights = self.rows(index)
        return (torch.from_numpy(fold_words(values, modulus)), torch.from_numpy(offsets),
                None if weights is None else torch.from_numpy(weights), self.pooling)
