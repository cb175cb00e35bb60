"""Parquet or CSV files with a --schema naming their columns (`shadowsync.data.tabular`):
converted once into an array directory (cached), which `ArraySource` then reads."""

from __future__ import annotations

from pathlib import Path

from shadowsync.data import tabular
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.sources.base import CriteoColumns
from shadowsync.errors import UserError


def _needs_schema(path: str) -> UserError:
    return UserError(f"{path}: Parquet and CSV data needs --schema naming its columns "
                     "(see docs/real-data.md)")


class ParquetCsvSource(CriteoColumns):
    name = "parquet-csv"

    def claims(self, path: str, schema: str | None) -> bool:
        return schema is not None or Path(path).suffix.lower() in tabular.SUFFIXES

    def resolve(self, path: str, schema: str | None) -> str:
        if schema is None:
            raise _needs_schema(path)
        return str(tabular.convert(path, schema))

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        raise _needs_schema(path)  # only reached unresolved: converted data is arrays
