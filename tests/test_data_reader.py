"""Criteo TSV reader, binary cache and batch sharding."""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowsync.bench.data import bench_conversion
from shadowsync.data import criteo
from shadowsync.data.dataset import CtrData, batches, num_batches, open_data
from shadowsync.errors import UserError

pytestmark = pytest.mark.usefixtures("private_cache_root")


def line(label: str = "1", ints: list[str] | None = None, cats: list[str] | None = None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{0x10000000 + i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats])


def write(path: Path, lines: list[str], end: str = "\n") -> str:
    path.write_text("".join(x + end for x in lines))
    return str(path)


def reference(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The DLRM loader's meaning of each line, one field at a time in plain Python."""
    labels, dense, cats = [], [], []
    for raw in text.splitlines():
        if not raw:
            continue
        f = raw.split("\t")
        labels.append(float(f[0]))
        dense.append([math.log(max(int(x), 0) + 1) if x else 0.0 for x in f[1:14]])
        cats.append([int(x, 16) if x else 0 for x in f[14:]])
    c = np.array(cats, dtype=np.uint64).view(np.int64)
    return np.array(labels, np.float32), np.array(dense, np.float32), c


# ---------------------------------------------------------------------------------------
# Values


def test_values_match_plain_python(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(300):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 10**rng.integers(1, 12))))
                for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}"
                for _ in range(26)]
        if i % 7 == 0:
            cats[5] = "FfFfFfFfFfFfFfFf"  # 16 digits, mixed case, above 2**63
            cats[6] = "a"
        lines.append(line(str(i % 2), ints, cats))
    path = write(tmp_path / "day_0", lines)
    data = open_data(path)
    labels, dense, cats = reference(Path(path).read_text())
    np.testing.assert_array_equal(data.labels, labels)
    np.testing.assert_allclose(data.dense, dense, rtol=1e-6)
    np.testing.assert_array_equal(data.cats, cats)
    assert data.skipped_lines == 0 and len(data) == 300 and data.teacher_ne(0, 10) is None


def test_negative_integers_become_zero_not_nan(tmp_path: Path) -> None:
    ints = ["-1", "-2", "-3", "-1000", "", "0", "5", "", "", "", "", "", ""]
    data = open_data(write(tmp_path / "neg.tsv", [line("0", ints)]))
    assert not np.isnan(data.dense).any()
    np.testing.assert_array_equal(data.dense[0, :6], 0.0)
    assert data.dense[0, 6] == pytest.approx(math.log(6))


def test_empty_fields_are_zero(tmp_path: Path) -> None:
    data = open_data(write(tmp_path / "empty.tsv", [line("1", [""] * 13, [""] * 26)]))
    assert data.labels[0] == 1.0
    assert not data.dense.any() and not data.cats.any()


def test_wide_integers_and_leading_zeros(tmp_path: Path) -> None:
    ints = ["9999999999999999", "0000000000000001", "123456789", *[""] * 10]
    data = open_data(write(tmp_path / "wide.tsv", [line("0", ints)]))
    assert data.dense[0, 0] == pytest.approx(math.log(1e16), rel=1e-6)
    assert data.dense[0, 1] == pytest.approx(math.log(2))
    assert data.dense[0, 2] == pytest.approx(math.log(123456790), rel=1e-6)


def test_gzip_file(tmp_path: Path) -> None:
    lines = [line(str(i % 2)) for i in range(50)]
    path = tmp_path / "day_1.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    data = open_data(str(path))
    assert len(data) == 50 and data.labels[1] == 1.0
    assert (tmp_path / "day_1.gz.ssbin" / "meta.json").exists()


def test_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(("\n".join(line() for _ in range(500)) + "\n").encode())[:200])
    with pytest.raises(UserError, match=r"cut\.gz: corrupt or truncated gzip data"):
        open_data(str(path))


def test_directory_in_name_order_skipping_hidden_json_and_caches(tmp_path: Path) -> None:
    d = tmp_path / "days"
    d.mkdir()
    write(d / "b.tsv", [line("1")])
    with gzip.open(d / "a.tsv.gz", "wt") as f:
        f.write(line("0") + "\n" + line("0") + "\n")
    write(d / ".hidden", ["junk"])
    (d / "teacher.json").write_text("{}")
    (d / "sub").mkdir()
    data = open_data(str(d))
    assert data.labels.tolist() == [0.0, 0.0, 1.0]
    assert (d / ".shadowsync-cache" / "meta.json").exists()
    assert open_data(str(d)).labels.tolist() == [0.0, 0.0, 1.0]  # its own cache is ignored


def test_crlf_and_missing_final_newline(tmp_path: Path) -> None:
    lines = [line("1"), line("0", cats=[""] * 26)]
    crlf = open_data(write(tmp_path / "crlf.tsv", lines, end="\r\n"))
    path = tmp_path / "nofinal.tsv"
    path.write_text("\n".join(lines))
    plain = open_data(str(path))
    for data in (crlf, plain):
        assert data.labels.tolist() == [1.0, 0.0]
        assert data.cats[0, 25] == 0x10000000 + 25 and data.cats[1, 25] == 0


def test_blank_lines_are_ignored_but_counted(tmp_path: Path) -> None:
    path = tmp_path / "blank.tsv"
    path.write_text(line() + "\n\n" + line() + "\n\n" + line("7") + "\n")
    with pytest.raises(UserError, match=r"blank\.tsv:5: label"):
        open_data(str(path))


# ---------------------------------------------------------------------------------------
# Errors: one line, FILE:LINE, as the user spelled the path


@pytest.mark.parametrize(
    "bad, message",
    [
        (line()[: line().rindex("\t")], "expected 40 tab-separated fields, got 39"),
        (line() + "\textra", "expected 40 tab-separated fields, got 41"),
        (line(cats=["0"] * 2 + ["zz12"] + ["0"] * 23),
         "field 17 (categorical C3): 'zz12' is not hexadecimal"),
        (line(cats=["1" * 17] + ["0"] * 25),
         "field 15 (categorical C1): '11111111111111111' has more than 16 hexadecimal digits"),
        (line(ints=["0", "1.5"] + ["0"] * 11), "field 3 (integer I2): '1.5' is not an integer"),
        (line(ints=["-"] + ["0"] * 12), "field 2 (integer I1): '-' is not an integer"),
        (line(ints=["0"] * 12 + ["1e3"]), "field 14 (integer I13): '1e3' is not an integer"),
        (line(ints=["1" * 17] + ["0"] * 12),
         "field 2 (integer I1): '11111111111111111' is out of range (more than 16 digits)"),
        (line("2"), "label must be 0 or 1, got '2'"),
        (line(""), "label must be 0 or 1, got ''"),
        (line("1.0"), "label must be 0 or 1, got '1.0'"),
    ],
)
def test_bad_line_message(tmp_path: Path, bad: str, message: str) -> None:
    path = write(tmp_path / "bad.tsv", [line(), line(), bad, line()])
    with pytest.raises(UserError) as err:
        open_data(path)
    assert str(err.value) == f"{path}:3: {message}"
    assert "\n" not in str(err.value)
    assert not (tmp_path / "bad.tsv.ssbin").exists()


def test_first_bad_line_wins_across_kinds_and_blocks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(criteo, "_BLOCK_BYTES", 1000)  # several blocks, lines split across them
    lines = [line() for _ in range(40)]
    lines[25] = line(ints=["x"] + ["0"] * 12)
    lines[31] = "short\tline"
    path = write(tmp_path / "many.tsv", lines)
    with pytest.raises(UserError, match=r"many\.tsv:26: field 2 \(integer I1\): 'x'"):
        open_data(path)
    lines[25] = line()
    write(tmp_path / "many.tsv", lines)
    with pytest.raises(UserError, match=r"many\.tsv:32: expected 40 tab-separated fields, got 2"):
        open_data(path)


def test_error_in_directory_names_the_file(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    write(d / "a", [line()])
    write(d / "b", [line(), line("x")])
    with pytest.raises(UserError) as err:
        open_data(str(d) + "/")
    assert str(err.value) == f"{os.path.join(str(d) + '/', 'b')}:2: label must be 0 or 1, got 'x'"


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "none.tsv").write_text("")
    with pytest.raises(UserError) as err:
        open_data(str(tmp_path / "none.tsv"))
    assert str(err.value) == f"{tmp_path / 'none.tsv'}: empty file"
    (tmp_path / "blank.tsv").write_text("\n\r\n\n")
    with pytest.raises(UserError, match=r"blank\.tsv: empty file$"):
        open_data(str(tmp_path / "blank.tsv"))


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        open_data("no/such/day_0")
    assert str(err.value) == "no/such/day_0: no such file or directory"


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="has no data files"):
        open_data(str(tmp_path))


# ---------------------------------------------------------------------------------------
# skip_bad_lines


def test_skip_bad_lines_counts_and_keeps_good_rows(tmp_path: Path) -> None:
    lines = [line("1"), line("2"), "a\tb", line(ints=["?"] + ["0"] * 12), line("0"), ""]
    path = write(tmp_path / "mixed.tsv", lines)
    data = open_data(path, skip_bad_lines=True)
    assert data.labels.tolist() == [1.0, 0.0]
    assert data.skipped_lines == 3
    meta = json.loads((tmp_path / "mixed.tsv.ssbin" / "meta.json").read_text())
    assert meta["skipped_lines"] == 3 and meta["skip_bad_lines"] is True
    # The skipping cache must not serve a run that asked for errors.
    with pytest.raises(UserError, match=r"mixed\.tsv:2: label must be 0 or 1, got '2'"):
        open_data(path)
    assert open_data(path, skip_bad_lines=True).skipped_lines == 3


def test_skip_bad_lines_with_only_bad_lines_is_empty(tmp_path: Path) -> None:
    path = write(tmp_path / "allbad.tsv", ["x", line("3")])
    with pytest.raises(UserError, match=r"allbad\.tsv: empty file"):
        open_data(path, skip_bad_lines=True)


def test_clean_cache_serves_both_settings(tmp_path: Path) -> None:
    path = write(tmp_path / "clean.tsv", [line()])
    assert criteo.load(path).converted
    assert not criteo.load(path, skip_bad_lines=True).converted


# ---------------------------------------------------------------------------------------
# Cache


def test_cache_is_reused_until_the_source_changes(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path / "day.tsv", [line("1"), line("0")])
    first = criteo.load(path)
    assert first.converted and first.cache_dir == tmp_path / "day.tsv.ssbin"
    assert isinstance(first.cats, np.memmap)

    calls = []
    real = criteo.convert
    monkeypatch.setattr(criteo, "convert", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = criteo.load(path)
    assert not again.converted and calls == []
    np.testing.assert_array_equal(again.labels, [1.0, 0.0])

    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000))
    assert criteo.load(path).converted and calls == [1]

    write(tmp_path / "day.tsv", [line("0"), line("0"), line("1")])
    data = open_data(path)
    assert data.labels.tolist() == [0.0, 0.0, 1.0] and calls == [1, 1]


def test_interrupted_conversion_keeps_the_old_cache(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path / "day.tsv", [line("1")])
    criteo.load(path)
    meta_before = (tmp_path / "day.tsv.ssbin" / "meta.json").read_text()
    write(tmp_path / "day.tsv", [line("0"), line("0")])

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(criteo, "parse_block", boom)
    with pytest.raises(KeyboardInterrupt):
        criteo.load(path)
    assert (tmp_path / "day.tsv.ssbin" / "meta.json").read_text() == meta_before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".day.tsv.ssbin.lock", "day.tsv",
                                                           "day.tsv.ssbin"]
    monkeypatch.undo()
    assert open_data(path).labels.tolist() == [0.0, 0.0]


def test_unwritable_data_directory_uses_the_cache_root(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SHADOWSYNC_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "day.tsv", [line()])
    real = criteo.publish_dir

    def refuse_near_data(build, dest: Path) -> None:
        # Permissions do not stop root, so refuse the way a read-only directory would.
        if dest.parent == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(dest))
        real(build, dest)

    monkeypatch.setattr(criteo, "publish_dir", refuse_near_data)
    arrays = criteo.load(path)
    assert arrays.converted and arrays.cache_dir.parent == tmp_path / "cache" / "files"
    again = criteo.load(path)
    assert not again.converted and again.cache_dir == arrays.cache_dir


def test_parse_bytes_matches_reference() -> None:
    text = "\n".join(line(str(i % 2), cats=[f"{i * 7919:x}"] * 26) for i in range(100))
    block = criteo.parse_bytes(text.encode())
    labels, dense, cats = reference(text)
    np.testing.assert_array_equal(block.cats, cats)
    np.testing.assert_array_equal(block.labels, labels)


# ---------------------------------------------------------------------------------------
# Batches


def _marked(n: int) -> CtrData:
    """Rows whose first dense value is their index, to see which rows a batch holds."""
    dense = np.zeros((n, 13), np.float32)
    dense[:, 0] = np.arange(n)
    cats = np.arange(n * 26, dtype=np.int64).reshape(n, 26)
    return CtrData(np.zeros(n, np.float32), dense, cats, source="test")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    batch_size=st.integers(1, 40),
    num_shards=st.integers(1, 5),
)
def test_shards_are_disjoint_and_cover_every_row(
    n: int, cut: tuple[float, float], batch_size: int, num_shards: int
) -> None:
    data = _marked(n)
    start, stop = sorted(int(c * n) for c in cut)
    seen: list[int] = []
    batch_count = 0
    for shard in range(num_shards):
        for dense, ids, _ in batches(data, start, stop, batch_size, shard, num_shards):
            rows = dense[:, 0].long().tolist()
            assert rows == list(range(rows[0], rows[0] + len(rows)))
            assert len(rows) <= batch_size and ids.shape == (len(rows), 26)
            assert (rows[0] - start) // batch_size % num_shards == shard
            seen += rows
            batch_count += 1
    assert sorted(seen) == list(range(start, stop))
    assert batch_count == num_batches(start, stop, batch_size)

    full = [r for s in range(num_shards)
            for d, _, _ in batches(data, start, stop, batch_size, s, num_shards, drop_last=True)
            for r in d[:, 0].long().tolist()]
    assert sorted(full) == list(range(start, start + (stop - start) // batch_size * batch_size))


def test_batch_tensors() -> None:
    cats = np.zeros((3, 26), np.int64)
    cats[0, 0] = -1  # the bits of 16 hex digits 'ffffffffffffffff'
    cats[1, 0] = 123_456
    data = CtrData(np.array([1, 0, 1], np.float32), np.ones((3, 13), np.float32), cats,
                   source="test")
    (dense, ids, labels), = list(batches(data, 0, 3, 8, table_size=1000))
    assert dense.dtype.is_floating_point and dense.shape == (3, 13)
    assert ids.dtype == torch.int64
    assert ids[0, 0].item() == (2**64 - 1) % 1000 and ids[1, 0].item() == 456
    assert labels.tolist() == [1.0, 0.0, 1.0]
    dense[0, 0] = 5.0  # tensors own writable memory
    with pytest.raises(ValueError):
        list(batches(data, 0, 4, 2))
    with pytest.raises(ValueError):
        list(batches(data, 0, 3, 2, shard=2, num_shards=2))


def test_examples_limits_file_rows(tmp_path: Path) -> None:
    data = open_data(write(tmp_path / "five.tsv", [line(str(i % 2)) for i in range(5)]),
                     examples=3)
    assert len(data) == 3


def test_bench_conversion_reports_rates(tmp_path: Path) -> None:
    result = bench_conversion(tmp_path, lines=20_000)
    assert result["lines"] == 20_000
    assert result["lines_per_s"] > 0 and result["reader_examples_per_s"] > 0
    assert not (tmp_path / "bench-conversion").exists()
