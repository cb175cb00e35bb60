"""The data-source registry: which source reads a path, and that a format added as one
source and one entry is read by every entry point (open, counts, table sizes, batches)."""

from __future__ import annotations

import numpy as np
import pytest

from shadowsync.data import sources
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.dataset import (
    Batch,
    batches,
    feature_counts,
    open_data,
    resolve,
    sparse_layout,
    table_rows_of,
)
from shadowsync.data.sources.base import CriteoColumns
from shadowsync.errors import UserError
from tests.conftest import write_array_dir


def test_each_kind_of_path_has_its_source(tmp_path):
    arrays_dir = write_array_dir(tmp_path / "arr", rows=10, num_dense=2, num_tables=3)
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("")
    picked = [sources.source_of(path, schema).name for path, schema in [
        ("synthetic", None), ("synthetic", "s.toml"), (str(tmp_path / "x.parquet"), None),
        (str(tmp_path / "x"), "s.toml"), (str(arrays_dir), None), (str(tsv), None)]]
    assert picked == ["synthetic", "synthetic", "parquet-csv", "parquet-csv",
                                     "arrays", "criteo"]
    with pytest.raises(UserError, match="needs --schema"):
        resolve(str(tmp_path / "x.csv"), None)


class ToySource(CriteoColumns):
    """A format of its own: `toy:N`, N rows of 1 dense feature and 2 ids."""

    name = "toy"

    def claims(self, path: str, schema: str | None) -> bool:
        return path.startswith("toy:")

    def feature_counts(self, path: str) -> tuple[int, int]:
        return 1, 2

    def declared_table_rows(self, path: str) -> list[int] | None:
        return [5, 7]

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        n = int(path.removeprefix("toy:"))
        return CtrData(np.arange(n) % 2, np.ones((n, 1), np.float32),
                       np.arange(2 * n).reshape(n, 2), source=path)


def test_a_new_format_is_one_source_and_one_entry(monkeypatch):
    monkeypatch.setattr(sources, "SOURCES", {"toy": ToySource(), **sources.SOURCES})
    assert feature_counts("toy:6") == (1, 2)
    assert table_rows_of("toy:6", 2, lambda t: [100] * t) == (5, 7)
    assert sparse_layout("toy:6") == "2 single-id"
    data = open_data("toy:6")
    first = next(batches(data, 0, 6, 4, table_size=[5, 7]))
    assert isinstance(first, Batch) and first.dense.shape == (4, 1)
    assert first.ids.tolist() == [[0, 1], [2, 3], [4, 5], [1, 0]]  # ids modulo 5 and 7
    assert first.labels.tolist() == [0.0, 1.0, 0.0, 1.0]
