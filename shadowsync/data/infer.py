"""A schema read off a Parquet or CSV file's columns (`shadowsync data schema FILE`, and
``--schema auto``), so that raw logs train without a hand-written one.

The rule, column by column (the label named by ``--label``, else the first of
``LABELS`` the file has):

- floating-point numbers and booleans: dense;
- integers and strings: one categorical feature each, ``ids = "raw"``: raw 64-bit ids
  (`shadowsync.data.ids.raw_ids`) for ``--tables dynamic``, with no table_size (the run's
  ``--table-memory`` or ``--table-size`` sets the budget);
- lists of integers or strings: a multi-hot feature (``ids = "raw"``, pooled by sum);
- anything else (lists of numbers, dates, structs) is left out, with a comment saying so.

A Parquet file's column types are its own. CSV has none: a column is read as integers when
every value of its first block is an integer (64-bit hashes past 2^63 included, which
pyarrow's own inference would read as floats), as numbers when every value is one, else as
strings.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from shadowsync.data.cache import cache_root
from shadowsync.data.tabular import arrow, list_files, unreadable_csv
from shadowsync.errors import UserError

if TYPE_CHECKING:
    import pyarrow

AUTO = "auto"  # --schema auto
LABELS = ("label", "click", "clicked", "target", "y")
_INTEGER = r"^\s*[-+]?[0-9]+\s*$"


def column_types(path: str) -> dict[str, pyarrow.DataType]:
    """Each column's type in the first file of `path` (CSV: as `_csv_types` reads them)."""
    pa = arrow()
    first = list_files(path)[0]
    if first.suffix.lower() != ".csv":
        try:
            schema = pa.parquet.read_schema(first)
        except Exception as e:  # noqa: BLE001 - pyarrow's errors for a file that is not Parquet
            raise UserError(f"{first}: not a readable Parquet file "
                            f"({str(e).splitlines()[0]})") from None
        return {field.name: field.type for field in schema}
    return _csv_types(first)


def _csv_types(f: Path) -> dict[str, pyarrow.DataType]:
    pa = arrow()
    pc, pcsv = pa.compute, pa.csv
    try:
        names = pcsv.open_csv(f).schema.names
        block = pcsv.open_csv(f, convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in names})).read_next_batch()
    except (pa.ArrowInvalid, OSError, StopIteration) as e:
        raise unreadable_csv(f, str(e)) from None
    types = {}
    for name in names:
        col = block.column(name)
        if len(col) and pc.all(pc.match_substring_regex(col, _INTEGER)).as_py():
            types[name] = pa.int64()
            continue
        try:
            col.cast(pa.float64())
            types[name] = pa.float64()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            types[name] = pa.string()
    return types


def infer_schema(path: str, label: str | None = None) -> str:
    """The schema of `path`'s columns, as TOML text (see the module for the rule)."""
    pa = arrow()
    types = column_types(path)
    if label is None:
        label = next((n for n in LABELS if n in types), None)
        if label is None:
            raise UserError(f"{path}: no column named {', '.join(LABELS)}; name the label with "
                            f"--label (columns: {', '.join(types)})")
    elif label not in types:
        raise UserError(f"--label {label}: {path} has no such column (columns: "
                        f"{', '.join(types)})")
    dense, single, multi, left_out = [], [], [], []
    for name, t in types.items():
        if name == label:
            continue
        if pa.types.is_floating(t) or pa.types.is_boolean(t):
            dense.append(name)
        elif _is_id(t):
            single.append(name)
        elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_id(t.value_type):
            multi.append(name)
        else:
            left_out.append(f"{name} ({t})")
    if not single and not multi:
        raise UserError(f"{path}: no integer, string or list column to make a categorical "
                        "feature of (see docs/real-data.md)")
    lines = [f"# The schema of {path}, read off its columns (shadowsync data schema): floats",
             "# dense, integers and strings raw ids for --tables dynamic.",
             f"label = {_quoted(label)}",
             f"dense = [{', '.join(_quoted(d) for d in dense)}]"]
    if left_out:
        lines.append(f"# left out: {', '.join(left_out)}")
    for kind, names in (("categorical", single), ("multi_hot", multi)):
        for name in names:
            lines += ["", f"[[{kind}]]", f"name = {_quoted(name)}", 'ids = "raw"']
    return "\n".join(lines) + "\n"


def _is_id(t: pyarrow.DataType) -> bool:
    pa = arrow()
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _quoted(text: str) -> str:
    """A TOML basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def auto_schema(path: str) -> str:
    """``--schema auto``: the inferred schema written once into the cache (named by its
    text), its path."""
    text = infer_schema(path)
    dest = cache_root() / "schemas" / f"{hashlib.sha1(text.encode()).hexdigest()[:16]}.toml"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(dest)
    return str(dest)
