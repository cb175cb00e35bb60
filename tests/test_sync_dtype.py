"""Compressed rounds: bf16 on the wire, fp32 parameters; error feedback loses nothing over
rounds, and two trainers agree bitwise on every mean."""

import os

import pytest
import torch

from shadowsync.transport.collectives import Compressor, TrainerExchange
from tests.helpers import run_spawned


def test_error_feedback_keeps_the_running_sum():
    gen = torch.Generator().manual_seed(0)
    wire = Compressor(torch.bfloat16)
    values = [torch.randn(1000, generator=gen) * 1e-3 + 0.3 for _ in range(200)]
    sent = [wire.encode("k", v) for v in values]
    assert all(s.dtype == torch.bfloat16 for s in sent)
    total = torch.stack(values).sum(0)
    got = torch.stack([s.float() for s in sent]).sum(0)
    # what was sent differs from what was meant by the last residual only (< one bf16 step)
    assert (got - total).abs().max() <= 0.3 * 2**-8 * 2
    plain = torch.stack([v.to(torch.bfloat16).float() for v in values]).sum(0)
    assert (plain - total).abs().max() > 10 * (got - total).abs().max()  # without feedback


def _rounds(rank: int, port: int, dtype: str, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ex = TrainerExchange(None, 2, dtype=dtype)
    gen = torch.Generator().manual_seed(rank)
    local = torch.full((500,), 1.0) + rank
    means = []
    for _ in range(30):
        ex.begin_round(False)
        local = local + torch.randn(500, generator=gen) * 1e-2
        mean = ex.mean(local)
        ex.end_round()
        means.append(mean)
        local = mean.clone()
    results.put((dtype, rank, torch.stack(means).tolist(), ex.bytes_sent))
    dist.destroy_process_group()


@pytest.mark.timeout(90)
def test_bf16_rounds_agree_and_track_fp32():
    from shadowsync.cluster.launch import free_port

    got = {}
    for dtype in ("fp32", "bf16"):
        port = free_port("127.0.0.1")
        for d, rank, means, sent in run_spawned(
                [(_rounds, (0, port, dtype)), (_rounds, (1, port, dtype))], 2, timeout=60):
            got[d, rank] = (torch.tensor(means), sent)
    for dtype in ("fp32", "bf16"):
        assert torch.equal(got[dtype, 0][0], got[dtype, 1][0])  # every trainer agrees
    fp32, bf16 = got["fp32", 0][0], got["bf16", 0][0]
    assert torch.equal(fp32[0], bf16[0])  # the first round goes in fp32
    assert bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max() < 1e-3  # the same trajectory, to bf16 rounding of drift
    # 30 rounds of 501 values: one fp32 round, then bf16 (half the bytes)
    assert got["fp32", 0][1] == 30 * 501 * 4
    assert got["bf16", 0][1] == 501 * 4 + 29 * 501 * 2
