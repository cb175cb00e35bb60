"""The Criteo display-ads schema, shared by the TSV reader and the synthetic generator.

Only these two sources have fixed feature counts; data given as arrays (``--data DIR`` with
``.npy`` files) brings its own, and everything downstream reads the counts from the data.
"""

from __future__ import annotations

import numpy as np

NUM_DENSE = 13  # integer fields I1..I13
NUM_CAT = 26  # categorical fields C1..C26


def log_transform(values: np.ndarray) -> np.ndarray:
    """``log(max(x, 0) + 1)`` as float32: what an integer field becomes."""
    return np.log1p(np.maximum(values, 0).astype(np.float64)).astype(np.float32)
