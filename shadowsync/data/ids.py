"""Raw 64-bit ids: the one integer mix every stable id hash here is built on."""

from __future__ import annotations

import numpy as np


def mix64(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea and Flood 2014) on uint64 words: a bijection, so
    distinct words stay distinct, with every output bit depending on every input bit; the
    same on every machine and in every process (unlike Python's salted `hash`). Into `out`
    (uint64, `x` itself allowed) when given, else a new array."""
    with np.errstate(over="ignore"):
        if out is None:
            x = x.astype(np.uint64, copy=True)
        elif out is not x:
            np.copyto(out, x, casting="unsafe")
            x = out
        s = np.empty_like(x)  # one scratch array for the three shifts
        x ^= np.right_shift(x, np.uint64(30), out=s)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= np.right_shift(x, np.uint64(27), out=s)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= np.right_shift(x, np.uint64(31), out=s)
    return x
