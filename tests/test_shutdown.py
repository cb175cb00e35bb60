"""Shutdown agreement: background loops on trainers that finish at very different times all
stop after the same round, and the job exits instead of hanging in a half-joined AllReduce;
a trainer that fails unexpectedly ends the job at once instead of hanging in RPC's shutdown."""

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from shadowsync.config import TrainConfig
from shadowsync.rules import make_rule
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.shadow import BackgroundSync, Pace
from shadowsync.spec.interval import SyncInterval
from shadowsync.transport.collectives import TrainerExchange
from tests.helpers import run_cli, run_spawned


def _trainer(rank: int, port: int, train_seconds: list[float], results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=len(train_seconds))
    param = torch.full((1000,), float(rank))
    group = ParamGroup("dense", [param], make_rule("ma"), "overwrite")
    runner = BackgroundSync([group], TrainerExchange(None, len(train_seconds)),
                            Pace(interval=SyncInterval(0.0), budget=0.03))
    runner.start()
    time.sleep(train_seconds[rank])  # this trainer's "workers" run for this long
    runner.stop()
    results.put((rank, runner.all_rounds, param[0].item()))
    dist.destroy_process_group()


@pytest.mark.timeout(90)
def test_uneven_stop_agrees_on_the_last_round():
    from shadowsync.cluster.launch import free_port

    seconds = [0.2, 3.0, 1.0]
    port = free_port("127.0.0.1")
    got = sorted(run_spawned([(_trainer, (r, port, seconds)) for r in range(3)], 3, timeout=60))
    rounds = {r for _, r, _ in got}
    assert len(rounds) == 1, got  # every trainer ran exactly the same rounds
    assert rounds.pop() > 10  # the early finishers kept syncing until the last one stopped
    assert {v for _, _, v in got} == {1.0}  # MA of 0, 1, 2 on the last round


_FOLLOWER = """
import ctypes, os, signal, sys
from pathlib import Path
from shadowsync.lifecycle.stop import STOP
from shadowsync.cluster.follow import follow_trainer0
STOP.install(grace_s=1.0, exit_while_starting=True)
STOP.mark_running()
follow_trainer0(Path(sys.argv[1]))
os.kill(os.getpid(), signal.SIGTERM)
libc = ctypes.CDLL(None)
while True:  # in C, as a server waiting in an RPC shutdown: no Python handler runs here
    libc.sleep(10)
"""


@pytest.mark.timeout(60)
def test_after_a_stop_a_process_stays_while_trainer0_saves_and_leaves_when_it_is_gone(tmp_path):
    """Past its own 1 s grace while trainer 0 lives (a save on a loaded machine), then gone
    within a second of trainer 0, with SIGTERM's exit code."""
    from shadowsync.lifecycle.attempts import PIDS, attempts_dir

    trainer0 = subprocess.Popen(["sleep", "30"])
    follower = None
    try:
        attempts_dir(tmp_path).mkdir(parents=True)
        (attempts_dir(tmp_path) / PIDS).write_text(f"0 trainer0 {trainer0.pid}\n")
        follower = subprocess.Popen([sys.executable, "-c", _FOLLOWER, str(tmp_path)],
                                    env={k: v for k, v in os.environ.items()
                                         if not k.startswith("SHADOWSYNC_")})
        time.sleep(4.0)
        assert follower.poll() is None, "left while trainer 0 was still saving"
        trainer0.kill()
        trainer0.wait()
        t0 = time.monotonic()
        assert follower.wait(timeout=10) == 143
        assert time.monotonic() - t0 < 2.0
    finally:
        for p in (trainer0, follower):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


# Runs a command with a 24 MiB file system of its own mounted on $SMALL_DISK (needs root).
SMALL_DISK = ["unshare", "--mount", "--", "sh", "-c",
              'mount -t tmpfs -o size=24m tmpfs "$SMALL_DISK" && exec "$0" "$@"']


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounting a small file system needs root and unshare")
@pytest.mark.timeout(150)
def test_a_final_checkpoint_that_does_not_fit_ends_the_job_at_once_in_one_line(tmp_path):
    """The run directory sits on a 24 MiB disk: the job trains, then its final checkpoint (the
    embedding server's 169 MiB shard) cannot be written. The job ends with one line naming
    the shard and the space, soon, and leaves no process. (Before: trainer 0 failed deep in
    torch.save, then waited at exit for its Hogwild workers, which waited for it in RPC's
    shutdown barrier, for an hour.)"""
    out = tmp_path / "small"
    out.mkdir()
    t0 = time.monotonic()
    r = run_cli(["train", "--trainers", "2", "--sync", "s-ma", "--examples", "20000",
                 "--max-restarts", "0", "-q", "--out", str(out)], timeout=120,
                cwd=os.getcwd(), env={"SMALL_DISK": str(out)}, prefix=SMALL_DISK)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    # 26 tables of 100k rows, each row its columns and its Adagrad accumulator, in fp32.
    shard_mib = 26 * 100_000 * (TrainConfig().model.table_width() + 1) * 4 / 2**20
    assert last.startswith(f"shadowsync: error: checkpoint not saved in {out}/checkpoint: "
                           f"shard emb0 needs {shard_mib:.1f} MiB and its disk has "), last
    assert took < 90
    assert r.leftover == []


@pytest.mark.timeout(30)
def test_a_second_signal_while_the_first_sets_the_stop_event_does_not_hang():
    """Ctrl-C reaches every process and the launcher forwards it again: the second signal's
    handler can run while the first is inside `Event.set`, holding the event's lock. Setting
    it again there waited forever (the stop then saved nothing and took the grace's 8 s)."""
    import multiprocessing
    import signal
    import threading

    from shadowsync.lifecycle.stop import StopRequest
    from shadowsync.train.held_out import HeldOut
    from shadowsync.train.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # request_stop needs only these
    trainer.stop_signal = None
    trainer.held_out = HeldOut(None, None, None, None)  # no evaluation under way
    trainer.stop_event = event = multiprocessing.get_context("spawn").Event()
    stop = StopRequest()  # what every job process installs for SIGINT / SIGTERM
    stop.subscribe(trainer.request_stop)
    notify_all = event._cond.notify_all

    def second_signal_while_set_holds_the_lock() -> None:
        stop._handle(signal.SIGINT, None)
        notify_all()

    event._cond.notify_all = second_signal_while_set_holds_the_lock
    first = threading.Thread(target=stop._handle, args=(signal.SIGINT, None), daemon=True)
    first.start()
    first.join(5)
    assert not first.is_alive(), "the second signal's handler waited on the first's lock"
    assert event.is_set() and trainer.stop_signal == signal.SIGINT
