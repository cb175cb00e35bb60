"""Data a user already has as arrays: a directory of ``.npy`` files, any feature counts.

    DIR/labels.npy   (N,)    clicks: 0/1 (bool, integer or float in [0, 1])
    DIR/dense.npy    (N, D)  float32 dense features, already normalised as the model wants
    DIR/cats.npy     (N, T)  integer ids: below their table's size (``check_ids``) for
                             fixed tables; any 64-bit words for --tables dynamic (raw ids:
                             uint64 or int64, the bit pattern is the id)

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

import numpy as np

from shadowsync.data.ids import integer_ids
from shadowsync.data.jagged import Jagged
from shadowsync.errors import UserError

FILES = ("labels.npy", "dense.npy", "cats.npy")
FEATURES = "features.json"  # optional: feature names, table sizes, multi-hot features
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


def declared(path: str) -> dict | None:
    """The directory's features.json (as the Parquet / CSV conversion writes it), or None."""
    f = Path(path) / FEATURES
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_text())
    except ValueError as e:
        raise UserError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{f}: expected a JSON object")
    return doc


def declared_table_rows(path: str) -> list[int | None] | None:
    """Table sizes the directory declares (features.json), in the tables' order: cats.npy's
    columns, then the multi-hot features; None for a table it gives none (the run's
    --table-size sizes those). None where it declares no size, or not each table."""
    doc = declared(path)
    if doc is None:
        return None
    single = _load(Path(path) / "cats.npy")
    entries = [*doc.get("categorical", []), *doc.get("multi_hot", [])]
    if (len(doc.get("categorical", [])) != (single.shape[1] if single.ndim == 2 else 0)
            or not all(isinstance(e, dict) for e in entries)):
        return None
    sizes = [int(e["table_size"]) if "table_size" in e else None for e in entries]
    return sizes if any(s is not None for s in sizes) else None


def shapes(path: str) -> tuple[int, int]:
    """(D, T) of an array directory, from the files' headers only; T counts the multi-hot
    features too (every embedding table)."""
    p = Path(path)
    dense, cats = _load(p / "dense.npy"), _load(p / "cats.npy")
    single = cats.shape[1] if cats.ndim == 2 else 0
    return (dense.shape[1] if dense.ndim == 2 else 0), single + len(multi_hot_specs(path))


def multi_hot_specs(path: str) -> list[dict[str, object]]:
    """The multi-hot features ``features.json`` declares (none without the file), checked:
    each has a name, a pooling of POOLINGS and ``weighted`` (default: whether its weights
    file exists)."""
    where = Path(path) / FEATURES
    doc = declared(path)
    entries = [] if doc is None else doc.get("multi_hot", [])
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
        size, raw = entry.get("table_size"), entry.get("ids") == "raw"
        if (size is not None or not raw) and (
                not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise UserError(f"{where}: multi_hot[{i}] ({name}): table_size must be a positive "
                            "integer (or \"ids\": \"raw\" for a dynamic table)")
        specs.append({"name": name, "pooling": pooling, "weighted": weighted,
                      "table_size": size, "raw": raw})
    return specs


def load_multi_hot(path: str, rows: int) -> list[Jagged]:
    """The multi-hot features of an array directory of ``rows`` rows, checked; raises
    UserError naming the file and row."""
    features = []
    for spec in multi_hot_specs(path):
        # "ids": "raw" (dynamic tables): any 64-bit word, the table size (if any) a budget.
        size = None if spec["raw"] else spec["table_size"]
        values, offsets, weights = check_multi_hot(path, spec["name"], size, rows)
        features.append(Jagged(spec["name"], values, offsets,
                               weights if spec["weighted"] else None, spec["pooling"]))
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
    return labels, dense, cats


def check_ids(path: str, cats: np.ndarray, table_rows: tuple[int, ...] | list[int],
              names: list[str] | None = None) -> None:
    """Every id below its table's size, or one line naming the file, column and row, and
    the --table-size that would hold them all. (Criteo text instead takes its hashes modulo
    the size: that is its format; an array's id past its table is a mistake.)"""
    sizes = np.asarray(table_rows, dtype=np.uint64)[:cats.shape[1]]  # then multi-hot tables
    if cats.shape[1] == 0:
        return
    top = np.zeros(cats.shape[1], dtype=np.uint64)
    first: tuple[int, int] | None = None
    for lo in range(0, len(cats), _CHECK_ROWS):
        # as unsigned words: a negative id is past every table too
        chunk = integer_ids(np.asarray(cats[lo:lo + _CHECK_ROWS]).reshape(-1)).view(
            np.uint64).reshape(-1, cats.shape[1])
        top = np.maximum(top, chunk.max(axis=0))
        past = chunk >= sizes
        if first is None and past.any():
            row = int(np.argmax(past.any(axis=1)))
            first = (lo + row, int(np.argmax(past[row])))
    if first is None:
        return
    row, col = first
    column = names[col] if names else f"column {col}"
    value = int(cats[row, col])
    if value < 0 or value >= 1 << 63:  # a 64-bit word: a hash rather than a row
        what = f"negative id {value} (ids must be >= 0" if value < 0 else f"id {value} (a hash"
        raise UserError(f"{Path(path) / 'cats.npy'}: row {row}, {column}: {what}; --tables "
                        "dynamic takes raw 64-bit ids)")
    need = np.maximum(sizes, top + 1)
    size_text = (str(int(need.max())) if len(set(sizes.tolist())) == 1
                 else ",".join(str(int(v)) for v in need))
    raise UserError(f"{Path(path) / 'cats.npy'}: row {row}, {column}: id {int(cats[row, col])} "
                    f"is past its table of {int(sizes[col]):,} rows; pass --table-size "
                    f"{size_text}")


def check_bag_ids(path: str, multi_hot: list[Jagged] | tuple[Jagged, ...],
                  table_rows: tuple[int, ...] | list[int]) -> None:
    """Every multi-hot id below its table's size (`table_rows`: the multi-hot tables'), or one
    line naming the file and row."""
    for feature, size in zip(multi_hot, table_rows):
        for lo in range(0, len(feature.values), _CHECK_ROWS):
            chunk = integer_ids(np.asarray(feature.values[lo:lo + _CHECK_ROWS]))
            past = chunk.view(np.uint64) >= np.uint64(size)  # a negative id: past it too
            if past.any():
                at = lo + int(np.argmax(past))
                row = int(np.searchsorted(feature.offsets, at, side="right")) - 1
                top = int(np.max(feature.values))
                raise UserError(f"{Path(path) / (feature.name + '.values.npy')}: row {row}: id "
                                f"{int(feature.values[at])} is past its table of {size:,} rows; "
                                f"its table needs {top + 1} (--table-size or features.json)")


def check_multi_hot(path: str, name: str, table_size: int | None,
                    rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(values, offsets, weights or None) of multi-hot feature `name`, checked: row i's ids
    are ``values[offsets[i]:offsets[i + 1]]`` (TorchRec's KeyedJaggedTensor layout); with no
    `table_size` (raw ids), any 64-bit words."""
    p = Path(path)
    vf, of, wf = (p / f"{name}.{part}.npy" for part in ("values", "offsets", "weights"))
    values, offsets = _load(vf), _load(of)
    weights = _load(wf) if wf.exists() else None
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise UserError(f"{vf}: {values.dtype} of shape {values.shape}, expected 1-D integer ids")
    if offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer):
        raise UserError(f"{of}: {offsets.dtype} of shape {offsets.shape}, expected 1-D integers")
    if len(offsets) != rows + 1:
        raise UserError(f"{of}: {len(offsets)} offsets, expected {rows + 1} (one per row and "
                        "one more)")
    if offsets[0] != 0:
        raise UserError(f"{of}: starts at {int(offsets[0])}, expected 0")
    if offsets[-1] != len(values):
        raise UserError(f"{of}: ends at {int(offsets[-1])}, but {vf.name} holds {len(values)} "
                        "ids")
    step = np.diff(offsets)
    if (step < 0).any():
        row = int(np.argmax(step < 0))
        raise UserError(f"{of}: row {row}: offsets go down ({int(offsets[row])} then "
                        f"{int(offsets[row + 1])})")
    for lo in range(0, len(values) if table_size is not None else 0, _CHECK_ROWS):
        chunk = np.asarray(values[lo:lo + _CHECK_ROWS])
        bad = np.flatnonzero((chunk < 0) | (chunk >= table_size))
        if len(bad):
            i = lo + int(bad[0])
            row = int(np.searchsorted(offsets, i, side="right")) - 1
            v = int(values[i])
            if v < 0:
                raise UserError(f"{vf}: row {row}: negative id {v} (ids must be >= 0)")
            top = int(np.max(values))
            raise UserError(f"{vf}: row {row}: id {v} is past its table of {table_size:,} rows; "
                            f"set its table_size to {top + 1} in features.json")
    if weights is not None:
        if weights.shape != values.shape or weights.dtype != np.float32:
            raise UserError(f"{wf}: {weights.dtype} of shape {weights.shape}, expected float32 "
                            f"of shape {values.shape} (one weight per id)")
        finite = np.isfinite(weights)
        if not finite.all():
            i = int(np.argmin(finite))
            row = int(np.searchsorted(offsets, i, side="right")) - 1
            raise UserError(f"{wf}: row {row}: weight {weights[i]} is not a finite number")
    return values, offsets, weights
