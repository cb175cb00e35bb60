"""Peers of other libraries in the benchmarks: skipped with one clear line when absent, and
(only where the optional `peers` extra is installed) TorchRec's job trains."""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
from dataclasses import replace

import pytest

from shadowsync.bench import peers
from shadowsync.bench.sync import JobRuns, job, peer_variants
from shadowsync.train.tasks import plan_data


def _hide(monkeypatch, *names: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in names else real(name, *a))


def test_missing_peer_is_named_with_the_install_hint(monkeypatch):
    _hide(monkeypatch, "torchrec")
    line = peers.missing("torchrec")
    assert line is not None and "\n" not in line
    # whichever of torchrec's packages are absent are named, torchrec first
    assert line.startswith("peer torchrec skipped: torchrec") and "not installed" in line
    assert peers.INSTALL_HINT in line


def test_bench_skips_a_missing_peer_and_says_so(monkeypatch, tmp_path, capsys):
    _hide(monkeypatch, "torchrec", "fbgemm_gpu")
    got = peer_variants(JobRuns(tmp_path, job(1000), iter(range(10))))
    assert got["variants"] == {}
    assert got["status"]["torchrec"] == peers.missing("torchrec")
    assert "bench sync: peer torchrec skipped: torchrec, fbgemm_gpu not installed" \
        in capsys.readouterr().out


def test_installed_peer_becomes_a_quality_variant(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(peers, "missing", lambda name: None)
    got = peer_variants(JobRuns(tmp_path, job(1000), iter(range(10))))
    assert list(got["variants"]) == ["torchrec/quality"]
    assert got["status"] == {"torchrec": "runs"}
    assert "peer torchrec runs beside s-bmuf" in capsys.readouterr().out


@pytest.mark.timeout(240)
@pytest.mark.skipif(peers.missing("torchrec") is not None,
                    reason="the optional peers extra (torchrec) is not installed")
def test_torchrec_peer_trains_the_job(tmp_path):
    # 40k examples of the default data (78 steps a rank, inside the 300-step warmup and then
    # the decay): TorchRec's sharded job learns (NE below the mean click rate's 1.0; 0.93
    # measured), every trained example is counted, whole tables on CPU.
    result = peers.runner("torchrec")(job(40_000), tmp_path / "tr")
    assert result["examples"] == 40_000 // 256 // 2 * 2 * 256
    assert result["eps"] > 0
    assert math.isfinite(result["eval_ne"]) and result["eval_ne"] < 0.97
    plan = plan_data(job(40_000))
    assert result["eval_examples"] == plan.eval_stop - plan.eval_start  # every held-out row
    assert result["plan"] == ["table_wise"]
    # every row's Adagrad accumulator started where ours do (one per row of the 26 tables)
    assert result["accumulators_started"] == sum(plan.features.table_rows)
    assert (tmp_path / "tr" / "summary.json").exists()
    assert multiprocessing.active_children() == []


def test_torchft_mode_without_torchft_is_one_clear_error(monkeypatch):
    from types import SimpleNamespace

    from shadowsync.errors import UserError
    from shadowsync.runners.torchft_ma import torchft_runner

    _hide(monkeypatch, "torchft")
    with pytest.raises(UserError, match="--sync torchft-ma needs torchft"):
        torchft_runner(SimpleNamespace(sync=replace(job(1000), sync="torchft-ma").sync,
                                       store=("127.0.0.1", 1)))


def test_torchft_peer_needs_a_private_namespace(monkeypatch):
    from shadowsync.bench.peers import torchft_localsgd

    monkeypatch.setattr(torchft_localsgd.os, "geteuid", lambda: 1000)
    reason = torchft_localsgd.unavailable()
    assert reason is not None and "listens on every interface" in reason


def test_a_failing_peer_is_one_line_and_the_bench_goes_on(monkeypatch, tmp_path, capsys):
    calls = []

    def broken(cfg, out):
        calls.append(out)
        raise RuntimeError("peer rank 0 failed: table t1 has local_cols=17 not divisible by 4")

    monkeypatch.setattr(peers, "missing", lambda name: None)
    monkeypatch.setattr(peers, "runner", lambda name: broken)
    got = peer_variants(JobRuns(tmp_path, job(1000), iter(range(10))))
    go = got["variants"]["torchrec/quality"]
    assert go() == go() == {"eps": None, "eval_ne": None, "wall_s": None}
    assert len(calls) == 1  # its later repeats do not run it again
    line = got["status"]["torchrec"]
    assert line.startswith("peer torchrec failed: ") and "not divisible by 4" in line
    assert f"bench sync: {line}\n" in capsys.readouterr().out


@pytest.mark.parametrize("width", [16, 17, 3])
def test_padded_tables_for_fbgemm_train_as_ours(width):
    """fbgemm takes rows whose width is a multiple of 4: the peer pads its tables, starts
    their accumulators at k times ours and steps at sqrt(k) times our rate, k = width /
    padded. The padded tables' first `width` columns then follow ours step for step."""
    import torch

    from shadowsync.bench.peers.padded_tables import fbgemm_tables
    from shadowsync.embeddings.tables import EmbeddingTables

    padded, lr, accumulator = fbgemm_tables(width, 0.2, 0.05)
    assert padded % 4 == 0 and width <= padded < width + 4
    ours = EmbeddingTables([50, 30], width, lr=0.2, initial_accumulator=0.05)
    weight = torch.cat([ours.weight, torch.zeros(80, padded - width)], dim=1)
    theirs = EmbeddingTables.from_tensors([50, 30], padded, "adagrad", lr, 1e-8,
                                          weight, torch.full((80,), accumulator))
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        rows = torch.randint(0, 80, (40,), generator=gen)  # repeats included
        grads = torch.randn(40, width, generator=gen)
        ours.apply_rows(rows, grads)
        theirs.apply_rows(rows, torch.cat([grads, torch.zeros(40, padded - width)], dim=1))
    torch.testing.assert_close(theirs.weight[:, :width], ours.weight)
    assert not theirs.weight[:, width:].any()
    unchanged = EmbeddingTables([50, 30], width, lr=0.2, initial_accumulator=0.05).weight
    assert not torch.equal(ours.weight, unchanged)  # the steps did move the rows
