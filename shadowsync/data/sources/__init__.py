"""Every data format, in one table: `--data` (and `--eval-data`) is read by the first source
in `SOURCES` that claims the path.

Adding a format is one module with a class that follows `DataSource` (`base.py`: claims,
resolve, feature_counts, declared_table_rows, sparse_features, open, check_ids; a format
with Criteo's columns inherits most of them from `CriteoColumns`) and one entry here, before
`criteo` (which claims every path left). A format that converts into another
(Parquet / CSV into arrays) returns the converted path from `resolve`; the rest of the run
then reads that path, so its source is the one that reads the conversion.
"""

from __future__ import annotations

from shadowsync.data.sources.base import CriteoColumns, DataSource
from shadowsync.data.sources.criteo_tsv import CriteoSource
from shadowsync.data.sources.npy_dir import ArraySource
from shadowsync.data.sources.parquet_csv import ParquetCsvSource
from shadowsync.data.sources.synthetic import SYNTHETIC, SyntheticSource

SOURCES: dict[str, DataSource] = {s.name: s for s in (
    SyntheticSource(), ParquetCsvSource(), ArraySource(), CriteoSource())}


def source_of(path: str, schema: str | None = None) -> DataSource:
    """The source that reads `path` (`schema`: the --schema file, if any)."""
    return next(s for s in SOURCES.values() if s.claims(path, schema))


__all__ = ["SOURCES", "SYNTHETIC", "CriteoColumns", "DataSource", "source_of"]
