"""Planted-teacher generator: statistics, determinism, TSV round trip, synthetic cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shadowsync.data import dataset, synth
from shadowsync.data.synth import BLOCK_ROWS, HASH_MODULUS, generate, write_tsv_dataset
from shadowsync.metrics.ctr import normalized_entropy

pytestmark = pytest.mark.usefixtures("private_cache_root")


@pytest.fixture(scope="module")
def big() -> synth.SynthData:
    return generate(200_000, seed=0)


def test_ctr_and_teacher_ne_are_in_range(big: synth.SynthData) -> None:
    assert 0.2 <= big.mean_ctr <= 0.3
    ne = big.teacher_ne()
    assert 0.70 <= ne <= 0.85
    assert ne == pytest.approx(normalized_entropy(big.probs, big.labels))
    # Labels really are draws from the probabilities.
    assert float(big.probs.mean()) == pytest.approx(big.mean_ctr, abs=0.005)


@pytest.mark.parametrize("seed", [1, 7])
def test_other_seeds_stay_in_range(seed: int) -> None:
    d = generate(100_000, seed)
    assert 0.2 <= d.mean_ctr <= 0.3
    assert 0.70 <= d.teacher_ne() <= 0.85


def test_arrays_have_reader_types_and_shapes(big: synth.SynthData) -> None:
    n = len(big)
    assert big.labels.dtype == np.float32 and big.labels.shape == (n,)
    assert big.dense.dtype == np.float32 and big.dense.shape == (n, 13)
    assert big.cats.dtype == np.int64 and big.cats.shape == (n, 26)
    assert big.probs.dtype == np.float32 and ((big.probs > 0) & (big.probs < 1)).all()
    assert set(np.unique(big.labels).tolist()) == {0.0, 1.0}
    assert not np.isnan(big.dense).any() and (big.dense >= 0).all()


def test_data_looks_like_criteo(big: synth.SynthData) -> None:
    # Some of everything the reader must handle: empty fields and I2's negative values.
    assert big.dense_missing.any() and (big.cats == 0).any()
    assert (big.dense_raw[:, 1] < 0).any()
    np.testing.assert_array_equal(big.dense[big.dense_missing], 0.0)
    present = big.cats[big.cats != 0]
    assert present.min() >= 0x10000000 and present.max() < 2**32  # 8 hex digits
    # Zipf-like: a few ids cover much of a large feature.
    widest = int(np.argmax([len(np.unique(big.cats[:, f])) for f in range(26)]))
    _, counts = np.unique(big.cats[:, widest], return_counts=True)
    top = np.sort(counts)[::-1]
    assert top[:10].sum() > 0.2 * counts.sum() and len(counts) > 1000


def test_ids_never_collide_in_a_table_of_100k_rows(big: synth.SynthData) -> None:
    for f in range(26):
        values = np.unique(big.cats[:, f])
        assert len(np.unique(values % HASH_MODULUS)) == len(values)


def test_deterministic_and_prefix_stable() -> None:
    a = generate(BLOCK_ROWS + 1000, seed=3)
    b = generate(BLOCK_ROWS + 1000, seed=3)
    for name in ("labels", "dense", "cats", "probs", "dense_raw", "dense_missing"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    short = generate(5000, seed=3)
    np.testing.assert_array_equal(short.probs, a.probs[:5000])
    other = generate(5000, seed=4)
    assert not np.array_equal(other.cats, short.cats)


def test_knobs_move_the_targets() -> None:
    cfg = synth.SynthConfig(target_ctr=0.1, target_ne=0.9)
    d = generate(100_000, seed=0, config=cfg)
    assert d.mean_ctr == pytest.approx(0.1, abs=0.01)
    assert d.teacher_ne() == pytest.approx(0.9, abs=0.02)
    with pytest.raises(ValueError):
        synth.SynthConfig(vocab_max=200_000)


def test_tsv_round_trip(tmp_path: Path) -> None:
    n, seed = 40_000, 5
    info = write_tsv_dataset(tmp_path, n, seed, eval_fraction=0.25, progress=False)
    truth = generate(n, seed)
    train = dataset.open_data(str(tmp_path / "train.tsv"))
    ev = dataset.open_data(str(tmp_path / "eval.tsv"))
    assert len(train) == 30_000 and len(ev) == 10_000
    for data, rows in ((train, slice(0, 30_000)), (ev, slice(30_000, n))):
        np.testing.assert_array_equal(data.labels, truth.labels[rows])
        np.testing.assert_array_equal(data.dense, truth.dense[rows])
        np.testing.assert_array_equal(data.cats, truth.cats[rows])
        assert data.skipped_lines == 0

    summary = json.loads((tmp_path / "teacher.json").read_text())
    assert summary["seed"] == seed and summary["examples"] == n
    assert summary["files"]["train.tsv"]["examples"] == 30_000
    assert summary["mean_ctr"] == pytest.approx(truth.mean_ctr)
    assert summary["train_ne"] == pytest.approx(truth.teacher_ne(0, 30_000), rel=1e-6)
    assert summary["eval_ne"] == pytest.approx(truth.teacher_ne(30_000, n), rel=1e-6)
    assert info["eval_ne"] == summary["eval_ne"]

    # Files written by the generator carry the teacher's NE as a hint; a directory of them
    # pools it over the files.
    assert train.teacher_ne() is None
    assert train.teacher_ne_hint == pytest.approx(summary["train_ne"])
    assert ev.teacher_ne_hint == pytest.approx(summary["eval_ne"])
    both = dataset.open_data(str(tmp_path))
    assert len(both) == n
    assert both.teacher_ne_hint == pytest.approx(truth.teacher_ne(), rel=1e-6)
    assert dataset.open_data(str(tmp_path / "train.tsv"), examples=10).teacher_ne_hint is None


def test_synthetic_is_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SHADOWSYNC_CACHE", str(tmp_path))
    first = dataset.open_data("synthetic", examples=3000, seed=2)
    assert (tmp_path / f"synth-3000-2-v{synth.SYNTH_VERSION}" / "meta.json").exists()
    assert isinstance(first.cats, np.memmap) and first.source == "synthetic"

    def no_generate(*args, **kwargs):
        raise AssertionError("regenerated although the cache exists")

    monkeypatch.setattr(synth, "generate", no_generate)
    again = dataset.open_data("synthetic", examples=3000, seed=2)
    truth = synth.Teacher(2)
    np.testing.assert_array_equal(again.cats, first.cats)
    assert again.teacher_ne(0, 3000) == pytest.approx(first.teacher_ne())
    assert again.teacher_ne(100, 200) is not None and again.teacher_ne_hint is None
    assert len(again) == 3000 and truth.a > 0


def test_format_lines_handles_edge_values() -> None:
    from shadowsync.data.criteo import parse_bytes

    raw = np.zeros((3, 13), np.int64)
    raw[0] = [-3, 0, 7, 999_999_999, 10, 0, 0, 0, 0, 0, 0, 0, 1]
    raw[1, 0] = 5
    missing = np.zeros((3, 13), bool)
    missing[1, :5] = True
    cats = np.zeros((3, 26), np.int64)
    cats[0] = 0x1234abcd
    cats[2, 3] = -1  # 16 hex digits
    text = synth.format_lines(np.array([1, 0, 1], np.float32), raw, missing, cats)
    first = text.split(b"\n")[0].split(b"\t")
    assert first[:5] == [b"1", b"-3", b"0", b"7", b"999999999"]
    assert first[14] == b"1234abcd"
    assert text.split(b"\n")[1].split(b"\t")[1:3] == [b"", b""]
    parsed = parse_bytes(text)
    np.testing.assert_array_equal(parsed.cats, cats)
    assert parsed.dense[0, 0] == 0.0 and parsed.dense[1, 0] == 0.0
