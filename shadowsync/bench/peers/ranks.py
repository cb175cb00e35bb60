"""Start a peer's ranks as local processes on loopback and collect what each returns."""

from __future__ import annotations

import os
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from shadowsync.cluster.launch import free_port

ADDR = "127.0.0.1"


def _rank_main(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple,
               results: Any) -> None:
    os.environ.update(MASTER_ADDR=ADDR, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        results.put((rank, "ok", fn(rank, world, port, *args)))
    except BaseException as e:  # reported to the parent, which raises it in one line
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(fn: Callable[..., Any], world: int, args: tuple = (),
              timeout_s: float = 3600.0) -> list[Any]:
    """Run fn(rank, world, port, *args) in `world` spawned processes; their results by rank.
    Raises RuntimeError with the first failure; every process is gone when it returns."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port(ADDR)
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, port, args, results),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world:
            try:
                rank, status, value = results.get(timeout=1.0)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"peer ranks did not finish in {timeout_s:.0f} s") from None
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(f"peer rank exited with code {dead[0].exitcode}") from None
                continue
            if status == "error":
                raise RuntimeError(f"peer rank {rank} failed: {value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [got[r] for r in range(world)]
