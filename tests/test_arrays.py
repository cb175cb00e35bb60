"""--data DIR of .npy arrays: any feature counts, and one line naming the file for bad arrays."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from shadowsync.data.dataset import batches, feature_counts, open_data
from shadowsync.errors import UserError
from tests.conftest import write_array_dir
from tests.helpers import run_cli


def test_counts_come_from_the_arrays(array_dir):
    assert feature_counts(str(array_dir)) == (5, 3)
    data = open_data(str(array_dir))
    assert (len(data), data.num_dense, data.num_tables) == (40_000, 5, 3)
    dense, ids, labels = next(batches(data, 0, 100, 64, table_size=[7, 11, 13]))
    assert dense.shape == (64, 5) and ids.shape == (64, 3) and labels.shape == (64,)
    assert ids.dtype == torch.int64
    assert (ids.numpy() == data.cats[:64] % np.array([7, 11, 13])).all()


def _spoil(path, name, arr):
    np.save(path / name, arr)
    return path


@pytest.mark.parametrize("name, arr, message", [
    ("dense.npy", np.zeros((7, 5), np.float32), "dense.npy: 7 rows, but labels.npy has 40000"),
    ("cats.npy", np.zeros((40_000, 3), np.float64), "cats.npy: dtype float64, expected an integer"),
    ("dense.npy", np.zeros((40_000, 5), np.float64), "dense.npy: dtype float64, expected float32"),
    ("dense.npy", np.where(np.arange(40_000)[:, None] == 9, np.nan, 0).repeat(5, 1)
     .astype(np.float32), "dense.npy: row 9: NaN or infinite value"),
    ("labels.npy", np.full(40_000, 2.0, np.float32), "labels.npy: row 0: label 2.0 is not in"),
    ("labels.npy", np.zeros((40_000, 2), np.float32), "labels.npy: shape (40000, 2), expected"),
])
def test_bad_arrays_name_the_file(array_dir, name, arr, message):
    _spoil(array_dir, name, arr)
    with pytest.raises(UserError, match=re.escape(message)) as e:
        open_data(str(array_dir))
    assert str(array_dir / name) in str(e.value) and "\n" not in str(e.value)


def test_missing_file_is_named(array_dir):
    (array_dir / "cats.npy").unlink()
    with pytest.raises(UserError, match="cats.npy: no such file"):
        open_data(str(array_dir))


@pytest.mark.timeout(60)
def test_bad_arrays_exit_2_before_the_output_directory_exists(tmp_path):
    data = write_array_dir(tmp_path / "a", rows=1000)
    _spoil(data, "cats.npy", np.full((1000, 3), -1, np.int32))
    out = tmp_path / "run"
    res = run_cli(["train", "--data", str(data), "--trainers", "1", "--embedding-servers", "0",
                   "--sync", "none", "--out", str(out)], timeout=50)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (f"shadowsync: error: {data / 'cats.npy'}: row 0, column 0: "
                                  "negative id -1 (ids must be >= 0; --tables dynamic takes "
                                  "raw 64-bit ids)")
    assert not out.exists()


def test_table_sizes_must_match_the_tables(array_dir):
    from shadowsync.config import TrainConfig
    from shadowsync.train.tasks import features_of

    cfg = TrainConfig(data=str(array_dir), table_size="10,20")
    with pytest.raises(UserError, match="--table-size: 2 sizes given, but the data has 3"):
        features_of(cfg)
    assert features_of(TrainConfig(data=str(array_dir), table_size=[10, 20, 30])).table_rows \
        == (10, 20, 30)


def test_an_id_past_its_table_names_file_column_row_and_the_size_to_pass(array_dir):
    from shadowsync.config import TrainConfig
    from shadowsync.train.tasks import plan_data

    cats = np.load(array_dir / "cats.npy")
    row = int(np.argmax(cats[:, 1] >= 40))
    with pytest.raises(UserError) as e:
        plan_data(TrainConfig(data=str(array_dir), table_size=[60, 40, 70]))
    assert str(e.value) == (f"{array_dir / 'cats.npy'}: row {row}, column 1: id {cats[row, 1]} "
                            "is past its table of 40 rows; pass --table-size 60,50,70")
    with pytest.raises(UserError, match="pass --table-size 50$"):
        plan_data(TrainConfig(data=str(array_dir), table_size=[30]))


def test_64_bit_words_are_raw_ids_and_past_every_fixed_table(array_dir):
    """uint64 hashes (and negative int64 ones) open as ids, batches keep their bits for
    dynamic tables (size 0) and fold them as unsigned words for fixed ones; a fixed table
    refuses them in one line."""
    from shadowsync.config import TrainConfig
    from shadowsync.data.dataset import batch_of
    from shadowsync.train.tasks import plan_data

    cats = np.load(array_dir / "cats.npy").astype(np.uint64)
    cats[0] = [2**64 - 1, 2**63, 5]
    np.save(array_dir / "cats.npy", cats)
    data = open_data(str(array_dir))
    raw = batch_of(data, slice(0, 1), np.zeros(3, np.uint64)).ids
    assert raw.tolist() == [[-1, -(2**63), 5]]
    folded = batch_of(data, slice(0, 1), np.array([7, 7, 7], np.uint64)).ids
    assert folded.tolist() == [[(2**64 - 1) % 7, 2**63 % 7, 5]]
    with pytest.raises(UserError) as e:
        plan_data(TrainConfig(data=str(array_dir), table_size=[100]))
    assert str(e.value) == (f"{array_dir / 'cats.npy'}: row 0, column 0: id {2**64 - 1} (a "
                            "hash; --tables dynamic takes raw 64-bit ids)")


@pytest.mark.timeout(60)
def test_an_id_past_its_table_exits_2_in_one_line(tmp_path):
    data = write_array_dir(tmp_path / "a", rows=1000)
    res = run_cli(["train", "--data", str(data), "--table-size", "20", "--trainers", "1",
                   "--embedding-servers", "0", "--sync", "none", "--out",
                   str(tmp_path / "r")], timeout=50)
    assert res.returncode == 2, res.stderr
    assert "is past its table of 20 rows; pass --table-size 50" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
