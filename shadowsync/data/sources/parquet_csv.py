"""Parquet or CSV files with a --schema naming their columns (`shadowsync.data.tabular`), or
``--schema auto`` (the schema read off the columns, `shadowsync.data.infer`): converted once
into an array directory (cached), which `ArraySource` then reads."""

from __future__ import annotations

from pathlib import Path

from shadowsync.data import infer, tabular
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.sources.base import CriteoColumns
from shadowsync.errors import UserError


def _needs_schema(path: str) -> UserError:
    return UserError(f"{path}: Parquet and CSV data needs --schema: auto (read off the "
                     "columns), or a file naming them (see docs/real-data.md)")


class ParquetCsvSource(CriteoColumns):
    name = "parquet-csv"

    def claims(self, path: str, schema: str | None) -> bool:
        return schema is not None or Path(path).suffix.lower() in tabular.SUFFIXES

    def resolve(self, path: str, schema: str | None) -> str:
        if schema is None:
            raise _needs_schema(path)
        return str(tabular.convert(path, schema_file(path, schema)))

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        raise _needs_schema(path)  # only reached unresolved: converted data is arrays


def schema_file(path: str, schema: str) -> str:
    """The schema file of --schema: itself, or for ``auto`` the one inferred from `path`."""
    return infer.auto_schema(path) if schema == infer.AUTO else schema
