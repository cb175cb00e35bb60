"""Raw 64-bit ids: what a categorical value becomes (`raw_ids`, the one rule every path
shares), and the one integer mix every stable id hash here is built on (`mix64`).

    from shadowsync.data.ids import raw_id, raw_ids
    raw_id("example.com")            # a string: its 64-bit blake2b hash, as an int64
    raw_ids(np.array([2**64 - 1], dtype=np.uint64))   # -> [-1]: the bit pattern is the id
"""

from __future__ import annotations

import hashlib

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


# -- the raw id of a value: what a categorical column's values become ------------------------

STRING_RULE = "blake2b-64"  # recorded in an exported model's schema (`raw_ids` says the rule)


def raw_id(value: int | str | bytes) -> int:
    """The raw id of one value, as `raw_ids` gives it for a column: an int64."""
    return int(raw_ids([value])[0])


def raw_ids(values: object) -> np.ndarray:
    """The raw 64-bit ids of a column of categorical values, as int64 words: the one rule
    training, evaluation, `predict` and an exported model's schema share.

    - an integer (any width, signed or not) is its own id, its 64-bit two's-complement bit
      pattern: uint64 2^64 - 1 and int64 -1 are the same id, and an id keeps every bit;
    - a string (or bytes, as UTF-8) is the first 8 bytes of its blake2b digest, read as a
      little-endian 64-bit word: stable across runs, processes and machines.

    `values`: a numpy array, a pyarrow Array or ChunkedArray, a pandas Series or a list.
    A null, a float or a bool is not an id (ValueError naming the first)."""
    if hasattr(values, "to_numpy") and type(values).__module__.startswith("pyarrow"):
        return _arrow_ids(values)
    if hasattr(values, "to_numpy"):  # a pandas Series (or Index)
        values = values.to_numpy()
    if isinstance(values, (list, tuple)):  # as they are: numpy would make mixed ones text
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
    else:
        arr = np.asarray(values)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if np.issubdtype(arr.dtype, np.integer):
        return integer_ids(arr)
    if arr.dtype.kind in "US":
        return _distinct_string_ids(arr)
    if arr.dtype == object:
        return _object_ids(arr)
    raise ValueError(f"{arr.dtype} values are not ids (ids are integers or strings)")


def fold_words(words: np.ndarray, modulus: np.ndarray | int) -> np.ndarray:
    """int64 id words read as unsigned 64-bit words, modulo `modulus` (one for every table,
    or one per table along the last axis), as int64: a fixed table's rows. A modulus of 0
    leaves its table's ids raw (dynamic tables map raw ids to rows themselves)."""
    ids, m = words.view(np.uint64), np.asarray(modulus, dtype=np.uint64)
    if m.all():
        folded = ids % m
    elif not m.any():
        folded = ids.copy()
    else:
        folded = np.where(m == 0, ids, ids % np.maximum(m, np.uint64(1)))
    return folded.view(np.int64)


def integer_ids(values: np.ndarray) -> np.ndarray:
    """Integers of any width as int64 words with the same low 64 bits (uint64's top bit
    becomes the sign: the bit pattern is the id)."""
    if values.dtype == np.uint64:
        return values.view(np.int64)
    return values.astype(np.int64)


def string_ids(strings: list[str] | list[bytes]) -> np.ndarray:
    """`raw_ids` of strings, one by one (callers hash each distinct string once)."""
    words = [int.from_bytes(hashlib.blake2b(s.encode() if isinstance(s, str) else s,
                                            digest_size=8).digest(), "little")
             for s in strings]
    return np.array(words, dtype=np.uint64).view(np.int64)


def _distinct_string_ids(arr: np.ndarray) -> np.ndarray:
    uniq, inverse = np.unique(arr, return_inverse=True)
    return string_ids(uniq.tolist())[inverse.reshape(-1)]


def _object_ids(arr: np.ndarray) -> np.ndarray:
    out = np.empty(len(arr), dtype=np.int64)
    text = [i for i, v in enumerate(arr) if isinstance(v, (str, bytes))]
    if text:
        out[text] = _distinct_string_ids(np.array([arr[i] for i in text], dtype=object))
    for i, v in enumerate(arr):
        if isinstance(v, (str, bytes)):
            continue
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"value {v!r} (row {i}) is not an id (ids are integers or strings)")
        out[i] = _signed(int(v))
    return out


def _signed(word: int) -> int:
    """An integer's low 64 bits as the int64 with those bits."""
    word %= 1 << 64
    return word - (1 << 64) if word >= 1 << 63 else word


def _arrow_ids(values: object) -> np.ndarray:
    """`raw_ids` of a pyarrow Array or ChunkedArray (read through its own methods: pyarrow is
    not imported here), strings hashed once each."""
    if values.null_count:
        raise ValueError("a null is not an id")
    if str(values.type).startswith("dictionary"):
        values = values.cast(values.type.value_type)
    kind = str(values.type)
    if kind.startswith(("int", "uint")):
        return integer_ids(np.asarray(values))
    if kind in ("string", "large_string", "binary", "large_binary"):
        enc = values.dictionary_encode()
        if hasattr(enc, "combine_chunks"):  # a ChunkedArray
            enc = enc.combine_chunks()
        return string_ids(enc.dictionary.to_pylist())[np.asarray(enc.indices)]
    raise ValueError(f"{kind} values are not ids (ids are integers or strings)")
