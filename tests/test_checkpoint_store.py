"""Checkpoint files: one shard round trip, publishing by rename, pruning, finding the newest,
and one-line errors for a missing, incomplete, corrupt or foreign checkpoint."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
import torch

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
from shadowsync.errors import UserError
from shadowsync.spec.interval import CheckpointEvery
from shadowsync.train.state import LAG, WorkerSlots, examples_in


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(4, 3, generator=g), "n": torch.tensor(7),
            "strided": torch.arange(10.0)[::2]}


def _publish(run, step: int) -> None:
    root = run / CHECKPOINT_DIR
    staging = staging_dir(root, f"{step}")
    save_shard(staging / "trainer0", _state())
    publish(staging, step_dir(root, step), {"step": step, "shards": ["trainer0"]}, "seed = 0\n")


def test_shard_round_trip_in_place(tmp_path):
    save_shard(tmp_path / "s", _state())
    target = {k: torch.zeros_like(v) for k, v in _state().items()}
    load_shard(tmp_path / "s", target, "trainer 0")
    for k, v in _state().items():
        assert torch.equal(target[k], v), k


def test_other_shape_is_one_line(tmp_path):
    save_shard(tmp_path / "s", _state())
    target = {**{k: torch.zeros_like(v) for k, v in _state().items()}, "w": torch.zeros(4, 5)}
    with pytest.raises(UserError, match=r"another model shape \(w: \(4, 3\) there, \(4, 5\)"):
        load_shard(tmp_path / "s", target, "trainer 0")


def test_corrupt_data_and_metadata_are_one_line(tmp_path):
    save_shard(tmp_path / "s", _state())
    target = {k: torch.zeros_like(v) for k, v in _state().items()}
    data = next((tmp_path / "s").glob("*.distcp"))
    data.write_bytes(b"not a tensor file")
    with pytest.raises(UserError, match="corrupt shard s"):
        load_shard(tmp_path / "s", target, "trainer 0")
    (tmp_path / "s" / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError, match="corrupt shard s"):
        load_shard(tmp_path / "s", target, "trainer 0")


def test_metadata_may_not_name_arbitrary_callables(tmp_path):
    save_shard(tmp_path / "s", _state())
    (tmp_path / "s" / ".metadata").write_bytes(pickle.dumps(print))
    with pytest.raises(UserError, match="refusing builtins.print"):
        load_shard(tmp_path / "s", {k: torch.zeros_like(v) for k, v in _state().items()}, "x")


def test_publish_prune_and_find_newest(tmp_path):
    run = tmp_path / "run"
    root = run / CHECKPOINT_DIR
    for step in (100, 300, 200):
        _publish(run, step)
    # What killed saves leave, whatever the staging's name, and a step moved in place whose
    # manifest was never written: never "latest", and removed by the next prune.
    for left in (staging_dir(root, "step-400"), staging_dir(root, "4242-7"), root / "step-500"):
        save_shard(left / "trainer0", _state())
    (root / "notes.txt").write_text("a file of the user's")  # not the store's: kept
    assert [p.name for p in published(root)] == ["step-100", "step-200", "step-300"]
    assert find_checkpoint(run) == step_dir(root, 300)
    assert find_checkpoint(root) == step_dir(root, 300)
    assert find_checkpoint(step_dir(root, 100)) == step_dir(root, 100)
    prune(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "step-200", "step-300"]
    manifest = json.loads((step_dir(root, 300) / "manifest.json").read_text())
    assert manifest["step"] == 300 and manifest["format"] == 1


def test_a_step_is_published_only_with_every_shard_it_lists(tmp_path):
    """A shard written elsewhere (its host's own disk) is missing where trainer 0 publishes:
    the step is refused in one line, and nothing of it is left."""
    from shadowsync.checkpoint.store import ShardsMissing

    root = tmp_path / CHECKPOINT_DIR
    staging = staging_dir(root, "1-1")
    save_shard(staging / "trainer0", _state())
    save_shard(tmp_path / "elsewhere" / "emb0", _state())
    with pytest.raises(ShardsMissing, match=r"shard emb0 is not there .*--checkpoint-dir"):
        publish(staging, step_dir(root, 8), {"step": 8, "shards": ["emb0", "trainer0"]}, "")
    assert published(root) == [] and list(root.iterdir()) == []


def test_missing_incomplete_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(UserError, match="no such file or directory"):
        find_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoint there"):
        find_checkpoint(tmp_path / "empty")
    run = tmp_path / "run"
    _publish(run, 5)
    step = step_dir(run / CHECKPOINT_DIR, 5)
    (step / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt checkpoint"):
        find_checkpoint(step)
    (step / "manifest.json").unlink()
    with pytest.raises(UserError, match="incomplete checkpoint"):
        find_checkpoint(step)


def test_checkpoint_every():
    assert CheckpointEvery.parse("600s") == CheckpointEvery("seconds", 600.0)
    assert CheckpointEvery.parse("250000") == CheckpointEvery("examples", 250000.0)
    assert CheckpointEvery.parse("0").kind == "off"
    assert CheckpointEvery.parse("never").never
    for text in ("600s", "250000", "0", "never"):  # written out as read
        assert str(CheckpointEvery.parse(text)) == text
    assert str(CheckpointEvery("seconds", 30.0)) == "30s"  # made in code: written in full
    with pytest.raises(UserError, match="--checkpoint-every"):
        CheckpointEvery.parse("10 minutes")


def test_positions_trail_steps_until_settled():
    slots = WorkerSlots([torch.zeros(3)], workers=2, optimizer="adagrad", start=[5, 0])
    slots.advance(0, 5 + LAG + 3)
    assert int(slots.positions[0]) == 5 + 3  # pushes may still be in flight
    slots.advance(0, 20, settled=True)
    assert int(slots.positions[0]) == 20
    slots.mark()
    slots.advance(0, 30, settled=True)
    assert slots.info() == {"positions": [20, 0], "steps": [30, 0]}


def test_positions_never_pass_the_step_the_shared_model_holds():
    """Workers of private replicas (ddp, torch-fr-ma): the shared model holds the replica of
    some step; a position never claims more. Lockstep workers resume at one step."""
    slots = WorkerSlots([torch.zeros(3)], workers=2, optimizer="sgd")
    slots.held[0] = 10
    slots.advance(1, 30)
    assert int(slots.positions[1]) == 10
    slots.held[0] = 40
    slots.advance(1, 31)
    assert int(slots.positions[1]) == 31 - LAG
    slots.align(12)
    assert slots.start_steps() == [12, 12] and slots.steps.tolist() == [12, 12]


def test_a_save_starts_early_enough_to_be_published_within_the_interval(monkeypatch):
    """--checkpoint-every N: a save starts when the job, at its recent pace, will be N past
    the last checkpoint by the time this save (as long as the last) and a failure's stop
    (LEAD_S) are over."""
    from shadowsync.checkpoint import coordinator

    clock = [100.0]
    monkeypatch.setattr(coordinator.time, "monotonic", lambda: clock[0])
    ck = coordinator.Checkpointer(Path("."), CheckpointEvery.parse("60000"), 2, "", 2, [], [],
                                  lambda t, p: 0, True)
    saves = []
    monkeypatch.setattr(ck, "save", lambda final: saves.append(clock[0]))
    ck.resumed_at(0)
    ck._save_s = 0.5
    for k in range(100):  # 10,000 job examples a second, a tick every 0.1 s
        clock[0] = 100.0 + k / 10
        ck.maybe_save(k * 500)  # trainer 0's (job's: twice)
        if saves:
            break
    # due when 10,000 * k / 10 + 10,000 * (0.5 + LEAD_S) >= 60,000
    due = (60_000 - 10_000 * (0.5 + coordinator.LEAD_S)) / 1_000
    assert saves == [pytest.approx(100.0 + math.ceil(due - 1e-9) / 10)]


def test_examples_in_counts_the_short_last_batch():
    # 1,000 rows, batches of 100 over 3 shards: shard 0 reads batches 0, 3, 6, 9
    assert examples_in(4, 0, 3, 0, 1000, 100) == 400
    assert examples_in(4, 0, 3, 0, 950, 100) == 350  # batch 9 holds 50 rows
    assert examples_in(10, 1, 3, 0, 1000, 100) == 300  # batches 1, 4, 7 only


def test_a_save_that_would_not_fit_on_the_disk_is_refused_in_one_line(tmp_path, monkeypatch):
    """The free space is checked before writing: a final save raises one line naming the
    shard, its size and the space left; a periodic one is skipped and the job goes on; either
    way nothing of it is left, and the newest published checkpoint stays."""
    import shutil as real_shutil

    from shadowsync.checkpoint import coordinator, shards, store

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1000))  # 4,000 bytes

    shards.register("trainer0", "model", Model())
    root = tmp_path / CHECKPOINT_DIR
    ck = coordinator.Checkpointer(root, CheckpointEvery.parse("1s"), 2, "", 1, [], [],
                                  lambda t, p: 0, True)
    first = ck.save(final=False)
    assert first is not None and published(root) == [first]

    usage = real_shutil.disk_usage(tmp_path)
    monkeypatch.setattr(store.shutil, "disk_usage",
                        lambda p: usage._replace(free=3 * 2**20 // 1000))  # 3,145 bytes
    with pytest.raises(coordinator.NoSpace) as e:
        ck.save(final=True)
    assert str(e.value) == (f"checkpoint not saved in {tmp_path / CHECKPOINT_DIR}: shard "
                            "trainer0 needs 3.9 KiB and its disk has 3.1 KiB free")
    ck._last_t -= 2  # the interval is over
    assert ck.maybe_save(0) is None
    assert published(root) == [first]
    assert sorted(p.name for p in root.iterdir()) == [first.name]


def test_a_shard_that_cannot_be_written_says_where_and_why_in_one_line(tmp_path):
    """DCP reports a failed write as a BaseException whose text is a traceback; the shard's
    writer says which shard and what the file system said."""
    from shadowsync.checkpoint.store import ShardNotWritten

    (tmp_path / "afile").write_text("x")  # a file where the staging directory should be
    with pytest.raises(ShardNotWritten) as e:
        save_shard(tmp_path / "afile" / "emb0", _state())
    assert str(e.value) == (f"checkpoint shard {tmp_path}/afile/emb0: NotADirectoryError: "
                            "[Errno 20] Not a directory: " f"'{tmp_path}/afile/emb0'")
