"""What a data source is: one format of CTR rows, from the path a user gives to the rows
(`CtrData`) the batches are cut from.

A source answers, for a path it reads, the questions a run asks before and while it trains:
the feature counts (from headers only: every process sizes its model and tables by them),
the table sizes and feature names the data declares, and the rows themselves. Batches are
then cut the same way from every source's rows (`shadowsync.data.dataset.batches`, typed
`Batch`: dense [B, D], ids [B, T] or `Bags`, labels [B]).
"""

from __future__ import annotations

from typing import Protocol

from shadowsync.data.ctr_data import CtrData
from shadowsync.data.schema import NUM_CAT, NUM_DENSE


class DataSource(Protocol):
    """One format of CTR rows. Registered by name in `shadowsync.data.sources.SOURCES`;
    `claims` decides which source reads a path (the first that claims it)."""

    name: str
    # Rows made from --examples and --seed rather than read: --examples sizes them whole (all
    # of them train but the tenth held out), and every worker opens that many again.
    generated: bool

    def claims(self, path: str, schema: str | None) -> bool:
        """Whether this source reads `path` (`schema`: the --schema file, if any)."""
        ...

    def resolve(self, path: str, schema: str | None) -> str:
        """Where the rows of `path` are read from: `path` itself, or what it converts into
        (once, cached), which another source then reads."""
        ...

    def feature_counts(self, path: str) -> tuple[int, int]:
        """(dense features D, categorical features T), from headers only."""
        ...

    def declared_table_rows(self, path: str) -> list[int | None] | None:
        """Table sizes the data declares (else, and where one is None, --table-size decides)."""
        ...

    def sparse_features(self, path: str, num_tables: int) -> list[dict[str, object]]:
        """Each table's feature in order: {"name", "multi_hot"} and, multi-hot, "pooling"
        and "weighted" (what a checkpoint's manifest records)."""
        ...

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        """The rows (the first `examples` of a file; `seed` draws generated data)."""
        ...

    def check_ids(self, data: CtrData, table_rows: tuple[int, ...]) -> None:
        """Every id of `data` within its table, or a one-line UserError (formats that take
        their ids modulo the table size have nothing to check)."""
        ...


class CriteoColumns:
    """Defaults of a source with Criteo's columns (13 dense, 26 single-id categorical
    features named C1..C26, hashes taken modulo --table-size): nothing to convert, declare
    or check."""

    generated = False

    def resolve(self, path: str, schema: str | None) -> str:
        return path

    def feature_counts(self, path: str) -> tuple[int, int]:
        return NUM_DENSE, NUM_CAT

    def declared_table_rows(self, path: str) -> list[int] | None:
        return None

    def sparse_features(self, path: str, num_tables: int) -> list[dict[str, object]]:
        return [{"name": f"C{i + 1}", "multi_hot": False} for i in range(num_tables)]

    def check_ids(self, data: CtrData, table_rows: tuple[int, ...]) -> None:
        return None


def first_rows(data: CtrData, examples: int | None) -> CtrData:
    return data if examples is None else data.head(examples)



