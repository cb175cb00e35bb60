"""Shutdown agreement: background loops on trainers that finish at very different times all
stop after the same round, and the job exits instead of hanging in a half-joined AllReduce."""

import time

import pytest
import torch
import torch.distributed as dist

from shadowsync.rules import make_rule
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.shadow import BackgroundSync, Pace
from shadowsync.transport.collectives import TrainerExchange
from tests.helpers import run_spawned


def _trainer(rank: int, port: int, train_seconds: list[float], results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=len(train_seconds))
    param = torch.full((1000,), float(rank))
    group = ParamGroup("dense", [param], make_rule("ma"), "overwrite")
    runner = BackgroundSync([group], TrainerExchange(None, len(train_seconds)),
                            Pace(interval=0.0, budget=0.03))
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
