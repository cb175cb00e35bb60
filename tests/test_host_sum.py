"""Trainers on one host average through shared memory: the same means, bitwise, as an
AllReduce, every trainer agreeing, nothing left in /dev/shm; trainers on different hosts
keep the AllReduce."""

import glob
import os

import pytest
import torch

from shadowsync.transport.collectives import TrainerExchange
from tests.helpers import run_spawned


def _rounds(rank: int, world: int, port: int, transport: str, dtype: str, fake_hosts: bool,
            results) -> None:
    import torch.distributed as dist

    from shadowsync.transport import host_sum

    if fake_hosts:  # each trainer in a host of its own, as namespace hosts are
        host_sum.shm.host_id = lambda: f"host{rank}"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ex = TrainerExchange(None, world, dtype=dtype, transport=transport)
    gen = torch.Generator().manual_seed(rank)
    local = torch.randn(1000, generator=gen)
    means, flags, staged = [], [], []
    for r in range(12):
        ex.begin_round(done=r >= 8 + 2 * rank)  # trainer 0 is done after 8 rounds, 1 after 10
        local = local + torch.randn(1000, generator=gen) * 1e-2
        area = ex.staging(1000)  # where a group takes its snapshot, as groups do
        staged.append(area is not None)
        if area is not None:
            local = area.copy_(local)
        means.append(ex.mean(local))
        flags.append(ex.end_round())
        local = means[-1].clone()
    shared = [h is not None for h in ex._host_sums.values()]
    # numpy, not a tensor: a tensor on a queue is passed by a file descriptor that this
    # process, about to exit, would have to stay alive to hand over
    results.put((transport, fake_hosts, rank, torch.stack(means).numpy(), flags, shared,
                 sorted(glob.glob(f"/dev/shm/shadowsync-{os.getpid()}-*")), staged))
    dist.destroy_process_group()


def _run(world: int, transport: str, dtype: str = "fp32", fake_hosts: bool = False):
    from shadowsync.cluster.launch import free_port

    port = free_port("127.0.0.1")
    got = run_spawned([(_rounds, (r, world, port, transport, dtype, fake_hosts))
                       for r in range(world)], world, timeout=60)
    return {g[2]: (*g[:3], torch.from_numpy(g[3]), *g[4:]) for g in got}


@pytest.mark.timeout(120)
def test_shared_memory_means_equal_the_allreduce_bitwise():
    shm = _run(2, "auto")
    ar = _run(2, "collective")
    for rank in (0, 1):
        assert shm[rank][5] == [True] and ar[rank][5] == [False]  # the path each one took
        # snapshots go straight into the shared slot from the second round (no copy)
        assert shm[rank][7] == [False] + [True] * 11 and ar[rank][7] == [False] * 12
        assert torch.equal(shm[rank][3], ar[rank][3])
        assert shm[rank][6] == []  # the slot files are unlinked once every trainer mapped them
    assert torch.equal(shm[0][3], shm[1][3])  # every trainer holds the same mean
    # the "done" flags travel with the sum: the rounds from the one where both are done on
    # are the last
    assert shm[0][4] == shm[1][4] == ar[0][4] == [False] * 10 + [True] * 2


@pytest.mark.timeout(120)
def test_three_trainers_sum_in_order_and_bf16_agrees():
    got = _run(3, "auto", dtype="bf16")
    means = [got[r][3] for r in range(3)]
    assert all(got[r][5] == [True] for r in range(3))
    assert torch.equal(means[0], means[1]) and torch.equal(means[0], means[2])
    fp32 = _run(3, "collective")[0][3]
    assert (means[0] - fp32).abs().max() < 1e-3  # bf16 rounds track fp32 ones


@pytest.mark.timeout(120)
def test_trainers_on_different_hosts_keep_the_allreduce():
    got = _run(2, "auto", fake_hosts=True)
    assert got[0][5] == [False] and got[1][5] == [False]
    assert torch.equal(got[0][3], _run(2, "collective")[0][3])


def test_doorbell_waits_for_every_peers_word_of_the_round(tmp_path):
    """Three trainers' pipes in one process: a wait for round k returns once each peer has
    rung k times, a peer a round ahead counts for the next round, and silence times out."""
    from shadowsync.transport.host_sum import Doorbell

    paths = [str(tmp_path / f"bell{r}") for r in range(3)]
    own = [Doorbell.make(p) for p in paths]
    bells = [Doorbell(r, own[r], {q: Doorbell.reach(paths[q]) for q in range(3) if q != r})
             for r in range(3)]
    bells[1].ring()
    with pytest.raises(TimeoutError, match="trainer 0"):
        bells[0].wait(1, timeout_s=0.05)  # trainer 2 has not filled round 1
    bells[2].ring()
    bells[2].ring()  # trainer 2 is a round ahead
    bells[0].wait(1)
    assert bells[0].heard == {1: 1, 2: 2}
    with pytest.raises(TimeoutError):
        bells[0].wait(2, timeout_s=0.05)  # round 2 still lacks trainer 1's word
    bells[1].ring()
    bells[0].wait(2)
    assert bells[0].heard == {1: 2, 2: 2}
    for fd in own + [fd for b in bells for fd in b.peers.values()]:
        os.close(fd)
