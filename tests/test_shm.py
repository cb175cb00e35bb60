"""Files under /dev/shm: a process killed before it could unlink its tables' files leaves
them behind; the launcher removes those of the job's processes that are gone, and no other."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from shadowsync.transport import shm

MAKE_AND_HANG = """
import sys, time, torch
from shadowsync.transport import shm
path = shm.new_path("emb0-weight")
shm.to_shared_file(torch.ones(4, 3), path)
print(path, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not shm.available(), reason="no writable /dev/shm")
@pytest.mark.timeout(60)
def test_files_of_a_killed_process_are_removed_and_no_others():
    mine = shm.new_path("live")
    shm.to_shared_file(torch.zeros(2), mine)
    proc = subprocess.Popen([sys.executable, "-c", MAKE_AND_HANG], stdout=subprocess.PIPE,
                            text=True)
    try:
        left = proc.stdout.readline().strip()
        assert os.path.exists(left) and left.startswith(f"/dev/shm/shadowsync-{proc.pid}-")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert os.path.exists(left)  # a killed process unlinks nothing
        assert shm.remove_left_by([proc.pid]) == [left]
        assert not os.path.exists(left) and os.path.exists(mine)  # this process's stays
        assert shm.remove_left_by([proc.pid]) == []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shm.unlink(mine)


def test_shortfall_names_dev_shm_the_bytes_and_the_fix(monkeypatch):
    """8 MiB of a 64 MiB tmpfs free: 4 MiB fit; 10 MiB are one line with both counts and the
    size the tmpfs would need (56 + 10 MiB, rounded up to a power of two)."""
    stat = os.statvfs_result((4096, 4096, 16384, 2048, 2048, 0, 0, 0, 0, 255))
    monkeypatch.setattr(shm.os, "statvfs", lambda path: stat)
    assert shm.free_bytes() == 8 * 2**20
    assert shm.shortfall(4 * 2**20, "host-a") is None
    line = shm.shortfall(10 * 2**20, "host-a")
    assert line == ("/dev/shm on host-a is too small for this job: its processes there need "
                    "10,485,760 bytes of shared memory and 8,388,608 are free; give it at least "
                    "128m (docker run --shm-size=128m, or on Kubernetes an emptyDir with medium: "
                    "Memory mounted on /dev/shm)")


def test_what_a_host_shares_adds_up_its_ranks_parts():
    """Closed forms: an embedding server's rows x (4 x width + 4) bytes under Adagrad; a
    trainer's model once, once more per Adagrad worker, plus its two sync slots; a host's
    total is the sum over the ranks on it, each with its fixed allowance."""
    import argparse

    from shadowsync.cluster import shm_room
    from shadowsync.cluster.parts import embedding_plan, layout_of, resolve
    from shadowsync.config import add_config_arguments, load_config
    from shadowsync.train.tasks import build_dense_model, features_of
    from shadowsync.transport.servers.embedding.server import shared_bytes

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    cfg = resolve(load_config(parser.parse_args(
        ["--table-size", "1000", "--embedding-servers", "2", "--trainers", "2",
         "--workers", "3"])))
    features = features_of(cfg)
    plan = embedding_plan(cfg.model, cfg.cluster, cfg.optim.batch_size, features)
    width, optimizer = cfg.model.table_width(), cfg.optim.table_optimizer(features.multi_hot)
    rows = [sum(plan.server_pieces(s)) for s in range(2)]
    assert sum(rows) == sum(features.table_rows)
    assert [shared_bytes(plan, s, width, optimizer) for s in range(2)] == [
        r * (4 * width + 4) for r in rows]
    sgd = {**optimizer, "optimizer": "sgd"}
    assert shared_bytes(plan, 0, width, sgd) == rows[0] * 4 * width
    dense = build_dense_model(cfg, features)
    params = list(dense.parameters())
    pages = shm_room.pages
    model = sum(pages(p.nbytes) for p in params)
    buffers = sum(pages(b.nbytes) for b in dense.buffers())
    slots = pages(2 * 4 * (sum(p.numel() for p in params) + len(params)))
    trainer = model * (1 + 3) + buffers + slots
    assert shm_room.trainer_bytes(dense, cfg.optim, cfg.cluster) == trainer
    layout = layout_of(cfg.cluster)
    emb = [pages(shared_bytes(plan, s, width, optimizer)) for s in range(2)]
    each = shm_room.PER_PROCESS
    assert shm_room.host_bytes(cfg, layout, range(0, 2)) == sum(emb) + 2 * each
    assert shm_room.host_bytes(cfg, layout, range(1, 3)) == emb[1] + 2 * each + trainer
    assert shm_room.needed_here(cfg, cfg.distributed) == shm_room.host_bytes(cfg, layout, range(4))
