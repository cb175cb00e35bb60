"""Data a user already has as arrays: a directory of ``.npy`` files, any feature counts.

    DIR/labels.npy   (N,)    clicks: 0/1 (bool, integer or float in [0, 1])
    DIR/dense.npy    (N, D)  float32 dense features, already normalised as the model wants
    DIR/cats.npy     (N, T)  integer ids, >= 0; reduced modulo the table size when read

Multi-hot features (several ids per row, see ``shadowsync.data.jagged``) are declared in
``DIR/features.json`` as ``{"multi_hot": [{"name": NAME, "table_size": ..., "pooling": "sum"
| "mean", "weighted": bool}, ...]}``, each held in ``NAME.values.npy`` (ids),
``NAME.offsets.npy`` (N + 1 entries) and, when weighted, ``NAME.weights.npy`` (float32). Their
tables follow the T columns of cats.npy, in the order declared; T may then be 0.

The arrays are memory-mapped, not copied, and checked once when opened; a problem is one
line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from shadowsync.data.jagged import Jagged
from shadowsync.errors import UserError

FILES = ("labels.npy", "dense.npy", "cats.npy")
FEATURES = "features.json"
POOLINGS = ("sum", "mean")
_CHECK_ROWS = 1 << 20  # rows checked at a time, so a large memory map is not read at once


def is_array_dir(path: str) -> bool:
    """Whether ``path`` is a directory of ``.npy`` arrays (rather than Criteo text files)."""
    p = Path(path)
    return p.is_dir() and any((p / name).exists() for name in FILES)


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: no such file (an array directory needs {', '.join(FILES)})")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a readable .npy array ({str(e).splitlines()[0]})") from None


def shapes(path: str) -> tuple[int, int]:
    """(D, T) of an array directory, from the files' headers only; T counts the multi-hot
    features too (every embedding table)."""
    p = Path(path)
    dense, cats = _load(p / "dense.npy"), _load(p / "cats.npy")
    single = cats.shape[1] if cats.ndim == 2 else 0
    return (dense.shape[1] if dense.ndim == 2 else 0), single + len(multi_hot_specs(path))


def multi_hot_specs(path: str) -> list[dict[str, Any]]:
    """The multi-hot features ``features.json`` declares (none without the file), checked:
    each has a name, a pooling of POOLINGS and ``weighted`` (default: whether its weights
    file exists)."""
    where = Path(path) / FEATURES
    if not where.is_file():
        return []
    try:
        declared = json.loads(where.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{where}: not readable JSON ({str(e).splitlines()[0]})") from None
    entries = declared.get("multi_hot", []) if isinstance(declared, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{where}: \"multi_hot\" must be a list of features")
    specs, seen = [], set()
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or "/" in name:
            raise UserError(f"{where}: multi_hot[{i}]: needs a \"name\" (a file name stem)")
        if name in seen:
            raise UserError(f"{where}: multi_hot[{i}]: feature {name!r} declared twice")
        seen.add(name)
        pooling = entry.get("pooling", "sum")
        if pooling not in POOLINGS:
            raise UserError(f"{where}: multi_hot[{i}] ({name}): pooling {pooling!r}, expected "
                            f"one of {', '.join(POOLINGS)}")
        weighted = entry.get("weighted", (Path(path) / f"{name}.weights.npy").exists())
        if not isinstance(weighted, bool):
            raise UserError(f"{where}: multi_hot[{i}] ({name}): weighted must be true or false")
        size = entry.get("table_size")
        if size is not None and (not isinstance(size, int) or size < 1):
            raise UserError(f"{where}: multi_hot[{i}] ({name}): table_size must be a positive "
                            "integer")
        specs.append({"name": name, "pooling": pooling, "weighted": weighted,
                      "table_size": size})
    return specs


def load_multi_hot(path: str, rows: int) -> list[Jagged]:
    """The multi-hot features of an array directory of ``rows`` rows, checked; raises
    UserError naming the file and row."""
    p = Path(path)
    features = []
    for spec in multi_hot_specs(path):
        name = spec["name"]
        where = {kind: p / f"{name}.{kind}.npy" for kind in ("values", "offsets", "weights")}
        values, offsets = _load(where["values"]), _load(where["offsets"])
        weights = _load(where["weights"]) if spec["weighted"] else None
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            raise UserError(f"{where['values']}: shape {values.shape} dtype {values.dtype}, "
                            "expected one integer id per entry (nnz,)")
        if offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer):
            raise UserError(f"{where['offsets']}: shape {offsets.shape} dtype {offsets.dtype}, "
                            f"expected integers ({rows + 1},)")
        if len(offsets) != rows + 1:
            raise UserError(f"{where['offsets']}: {len(offsets)} entries, expected {rows + 1} "
                            f"(one more than the {rows} rows of labels.npy)")
        if offsets[0] != 0:
            raise UserError(f"{where['offsets']}: row 0: starts at {int(offsets[0])}, not 0")
        for lo in range(0, rows, _CHECK_ROWS):
            hi = min(rows, lo + _CHECK_ROWS)
            step = np.diff(offsets[lo:hi + 1])
            if (step < 0).any():
                row = lo + int(np.argmax(step < 0))
                raise UserError(f"{where['offsets']}: row {row}: offsets decrease "
                                f"({int(offsets[row])} then {int(offsets[row + 1])})")
        if offsets[-1] != len(values):
            raise UserError(f"{where['offsets']}: row {rows - 1}: ends at {int(offsets[-1])}, "
                            f"but {where['values'].name} holds {len(values)} ids")
        if weights is not None:
            if weights.ndim != 1 or len(weights) != len(values):
                raise UserError(f"{where['weights']}: shape {weights.shape}, expected "
                                f"({len(values)},), one weight per id of {where['values'].name}")
            if weights.dtype != np.float32:
                raise UserError(f"{where['weights']}: dtype {weights.dtype}, expected float32")
        size = spec["table_size"]
        for lo in range(0, len(values), _CHECK_ROWS):
            chunk = values[lo:lo + _CHECK_ROWS]
            bad = chunk < 0
            what = "negative id {} (ids must be >= 0)"
            if not bad.any() and size is not None:
                bad = chunk >= size
                what = f"id {{}} is past the table of {size} rows declared in {FEATURES}"
            if weights is not None and not bad.any():
                bad = ~np.isfinite(weights[lo:lo + _CHECK_ROWS])
                if bad.any():
                    at = lo + int(np.argmax(bad))
                    row = int(np.searchsorted(offsets, at, side="right")) - 1
                    raise UserError(f"{where['weights']}: row {row}: NaN or infinite weight")
            if bad.any():
                at = lo + int(np.argmax(bad))
                row = int(np.searchsorted(offsets, at, side="right")) - 1
                raise UserError(f"{where['values']}: row {row}: "
                                + what.format(int(values[at])))
        features.append(Jagged(name, values, offsets, weights, spec["pooling"]))
    return features


def load(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, dense, cats) of an array directory, checked; raises UserError naming the file."""
    p = Path(path)
    labels, dense, cats = (_load(p / name) for name in FILES)
    where = {name: p / name for name in FILES}
    if labels.ndim != 1:
        raise UserError(f"{where['labels.npy']}: shape {labels.shape}, expected (N,)")
    n = len(labels)
    if n == 0:
        raise UserError(f"{where['labels.npy']}: no examples")
    for name, arr in (("dense.npy", dense), ("cats.npy", cats)):
        if arr.ndim != 2:
            raise UserError(f"{where[name]}: shape {arr.shape}, expected (N, columns)")
        if len(arr) != n:
            raise UserError(f"{where[name]}: {len(arr)} rows, but labels.npy has {n}")
    if not (labels.dtype == np.bool_ or np.issubdtype(labels.dtype, np.integer)
            or np.issubdtype(labels.dtype, np.floating)):
        raise UserError(f"{where['labels.npy']}: dtype {labels.dtype}, expected bool, "
                        "integer or float")
    if dense.dtype != np.float32:
        raise UserError(f"{where['dense.npy']}: dtype {dense.dtype}, expected float32 "
                        "(convert with arr.astype(np.float32))")
    if not np.issubdtype(cats.dtype, np.integer):
        raise UserError(f"{where['cats.npy']}: dtype {cats.dtype}, expected an integer type")
    if cats.shape[1] == 0 and not multi_hot_specs(path):
        raise UserError(f"{where['cats.npy']}: no categorical columns (at least one is needed)")
    for lo in range(0, n, _CHECK_ROWS):
        hi = min(n, lo + _CHECK_ROWS)
        y = labels[lo:hi].astype(np.float64)
        if not np.all((y >= 0) & (y <= 1)):  # NaN fails too
            row = lo + int(np.argmin((y >= 0) & (y <= 1)))
            raise UserError(f"{where['labels.npy']}: row {row}: label {labels[row]} is not in "
                            "[0, 1]")
        finite = np.isfinite(dense[lo:hi]).all(axis=1)
        if not finite.all():
            row = lo + int(np.argmin(finite))
            raise UserError(f"{where['dense.npy']}: row {row}: NaN or infinite value")
        negative = (cats[lo:hi] < 0).any(axis=1)
        if negative.any():
            row = lo + int(np.argmax(negative))
            raise UserError(f"{where['cats.npy']}: row {row}: negative id "
                            f"{int(cats[row].min())} (ids must be >= 0)")
    return labels, dense, cats
