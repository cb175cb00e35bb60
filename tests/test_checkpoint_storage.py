"""Checkpoint storage across hosts: the store at an fsspec URL (memory://, file://) as at a
plain path, a job written to and resumed from a file:// URL, the check that every host sees
one checkpoint storage, and one agreed checkpoint for a restart."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch

from shadowsync.checkpoint.storage import Url, location
from shadowsync.checkpoint.store import (
    CHECKPOINT_DIR,
    find_checkpoint,
    load_shard,
    prune,
    publish,
    published,
    save_shard,
    staging_dir,
    step_dir,
)
from shadowsync.cluster import resume
from shadowsync.config import CheckpointConfig, config_from_options
from shadowsync.errors import UserError
from tests.helpers import ONE_TRAINER, _kill_session, run_cli, summary


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(5, 3, generator=g), "n": torch.tensor(3)}


def _save_step(root, step: int) -> None:
    staging = staging_dir(root, f"{os.getpid()}-{step}")
    save_shard(staging / "trainer0", _state())
    publish(staging, step_dir(root, step), {"step": step, "shards": ["trainer0"]}, "seed = 0\n")


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_the_store_at_a_url_works_as_at_a_path(tmp_path, scheme):
    """Publish, find the newest, prune what killed saves left, read back: the same at a URL
    (through fsspec and DCP's fsspec storage) as at a plain path, to the bit."""
    base = f"memory://{uuid.uuid4().hex}" if scheme == "memory" else f"file://{tmp_path}/url"
    run = location(base)
    assert isinstance(run, Url)
    roots = [run / CHECKPOINT_DIR, tmp_path / "plain" / CHECKPOINT_DIR]
    for root in roots:
        for step in (100, 300, 200):
            _save_step(root, step)
        save_shard(staging_dir(root, "999-1") / "emb0", _state())  # a killed save
    url_root, plain_root = roots
    assert [p.name for p in published(url_root)] == ["step-100", "step-200", "step-300"]
    assert find_checkpoint(base) == step_dir(url_root, 300)
    assert str(find_checkpoint(str(step_dir(url_root, 100)))) == f"{url_root}/step-100"
    prune(url_root, keep=2)
    assert sorted(p.name for p in url_root.iterdir()) == ["step-200", "step-300"]
    got = {}
    for root in roots:
        got[root] = {k: torch.zeros_like(v) for k, v in _state().items()}
        load_shard(find_checkpoint(root) / "trainer0", got[root], "trainer 0")
    for k in _state():
        assert torch.allclose(got[url_root][k], got[plain_root][k], atol=1e-6, rtol=0), k
    manifest = json.loads((step_dir(url_root, 300) / "manifest.json").read_text())
    assert manifest["shards"] == ["trainer0"] and manifest["format"] == 1


def test_an_unknown_url_scheme_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--checkpoint-dir nosuch://b/x: no file system for "
                                        r"nosuch:// \(pip install 'shadowsync\[cloud\]'"):
        find_checkpoint("nosuch://b/x", "--checkpoint-dir")


@pytest.mark.timeout(240)
def test_a_job_writes_to_and_resumes_from_a_file_url_as_from_a_path(tmp_path):
    """One job keeps its checkpoints at a file:// URL (through fsspec and DCP's fsspec
    storage); a resume from its mid-run step at the URL and one from a plain copy of that
    step end in the same model (1e-6)."""
    import shadowsync

    url = f"file://{tmp_path}/store"
    # Long enough for trainer 0's ticks (0.1 s) to see the interval pass more than once.
    job = [*ONE_TRAINER, "--examples", "60000", "--checkpoint-every", "15000"]
    first = run_cli(["train", *job, "--out", str(tmp_path / "a"), "--checkpoint-dir", url], 120)
    assert first.returncode == 0, first.stderr
    steps = published(location(url))
    assert len(steps) >= 2 and summary(tmp_path / "a")["checkpoint"] == str(steps[-1])
    assert find_checkpoint(tmp_path / "a") == steps[-1]  # the run directory points there
    assert not list((tmp_path / "store").glob(".tmp-*"))
    mid = steps[0]
    shutil.copytree(tmp_path / "store" / mid.name, tmp_path / "copy" / mid.name)
    for out, source in (("b", str(mid)), ("c", str(tmp_path / "copy" / mid.name))):
        res = run_cli(["train", "--resume", source, "--out", str(tmp_path / out)], 120)
        assert res.returncode == 0, res.stderr
        s = summary(tmp_path / out)
        assert s["resumed_examples"] == int(mid.name[5:]) and s["examples"] == 60000
    from_url, from_path = (shadowsync.load(tmp_path / out).state_dict() for out in ("b", "c"))
    assert from_url.keys() == from_path.keys()
    for k, v in from_url.items():
        assert torch.allclose(v.float(), from_path[k].float(), atol=1e-6, rtol=0), k


def _ranks(world: int, work) -> list[object]:
    """Run `work(rank, exchange)` as `world` ranks in threads, with an all-gather between
    them as the process group gives one; each rank's result or exception."""
    barrier, slots = threading.Barrier(world, timeout=20), [None] * world
    results: list[object] = [None] * world

    def exchange_for(rank):
        def exchange(item):
            slots[rank] = item
            barrier.wait()
            everyone = list(slots)
            barrier.wait()
            return everyone
        return exchange

    def run(rank):
        try:
            results[rank] = work(rank, exchange_for(rank))
        except Exception as e:  # noqa: BLE001 - the test reads it
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_every_rank_refuses_a_checkpoint_storage_that_is_not_one_for_all(tmp_path):
    """Two ranks with an OUT each (two hosts' own disks): both refuse in one line naming
    --out and what to do; with one OUT both go on, and no token is left behind."""
    outs = [tmp_path / "host0" / "run", tmp_path / "host1" / "run"]
    results = _ranks(2, lambda r, ex: resume.check_one_storage(
        CheckpointConfig(), str(outs[r]), r, ex))
    for r, e in enumerate(results):
        assert isinstance(e, UserError), e
        line = str(e)
        assert "\n" not in line and line.startswith(f"--out {outs[r]}: checkpoints must be one "
                                                    "storage for every host, but rank 0")
        assert "does not see what rank 1" in line and "--checkpoint-dir s3://" in line
    shared = tmp_path / "shared"
    results = _ranks(2, lambda r, ex: resume.check_one_storage(
        CheckpointConfig(), str(shared), r, ex))
    assert results == [None, None]
    assert list((shared / CHECKPOINT_DIR).iterdir()) == []


def test_a_restart_resumes_every_rank_from_rank_0s_published_step(tmp_path, monkeypatch):
    """Each host lists its own OUT differently (one holds step-300, the other nothing): every
    rank takes rank 0's answer. A bad --resume fails on every rank, not only on rank 0."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    outs = [tmp_path / "host0", tmp_path / "host1"]
    _save_step(outs[0] / CHECKPOINT_DIR, 300)
    got = _ranks(2, lambda r, ex: resume.agreed_checkpoint(CheckpointConfig(), str(outs[r]),
                                                           r, ex))
    assert got == [str(step_dir(outs[0] / CHECKPOINT_DIR, 300))] * 2
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    bad = config_from_options(out=str(outs[1]), resume=str(tmp_path / "nope"))
    got = _ranks(2, lambda r, ex: resume.agreed_checkpoint(bad.checkpoint, bad.output.dir, r,
                                                           ex))
    assert all(isinstance(e, UserError) and "no such file" in str(e) for e in got), got


@pytest.mark.timeout(180)
def test_torchrun_hosts_with_an_out_each_are_refused_before_training(tmp_path):
    """Two torchrun agents (an embedding server, a trainer) on this machine, each given its
    own --out as hosts with their own disks would be: both end non-zero with the one line,
    before any example is trained or any checkpoint written; the agents' restart (torchrun
    --max-restarts) ends at once without saying it again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "1",
         "-m", "shadowsync.run", "--embedding-servers", "1", "--trainers", "1",
         "--examples", "4000", "--table-size", "2000", "--eval-points", "0", "--no-progress",
         "-q", "--out", str(tmp_path / f"host{h}" / "run")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True) for h in (0, 1)]
    try:
        outputs = [a.communicate(timeout=150) for a in agents]
    finally:
        leftover = [pid for a in agents for pid in _kill_session(a.pid)]
    assert leftover == []
    for h, (a, (_, err)) in enumerate(zip(agents, outputs)):
        assert a.returncode != 0, err[-2000:]
        assert err.count("checkpoints must be one storage for every host") == 1, err[-3000:]
        run = tmp_path / f"host{h}" / "run"
        assert not (run / "summary.json").exists()
        assert not list(run.glob(f"{CHECKPOINT_DIR}/*"))
