#!/usr/bin/env python3
"""--prefetch against the blocking round trip, step by step: one embedding server and one
client over RPC on loopback, the default job's tables (26 x 100,000 rows x 16 floats,
row-wise Adagrad) and batches of 256 skewed ids, and a fixed compute per step (a chain of
160 x 160 matmuls on one thread, about a DLRM step's). Depths 0, 1 and 2 run in interleaved
blocks of steps after a warm-up round; printed per depth: the median step time, the median
time a step waited for its rows, and steps a second against depth 0 (the median ratio and
its range block by block).

    python scripts/prefetch_steps.py [--rounds 6] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.multiprocessing as mp

from shadowsync.cluster.launch import free_port
from shadowsync.train.prefetch import RowPipeline
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding.client import RemoteEmbeddings
from shadowsync.transport.servers.embedding.plan import ShardingPlan
from shadowsync.transport.servers.embedding.server import serve

TABLES, ROWS, DIM, BATCH = 26, 100_000, 16, 256
PLAN = ShardingPlan(1, (ROWS,) * TABLES, 10**9)
LAYOUT = ClusterLayout(embedding_servers=1, dense_servers=0, trainers=1, workers=0)
DEPTHS = (0, 1, 2)


def server(port: int) -> None:
    torch.set_num_threads(1)
    serve(PLAN, 0, DIM, {"optimizer": "adagrad", "lr": 0.1, "initial_accumulator": 0.0},
          seed=0, share=False)
    RpcEndpoint("127.0.0.1", port).join(LAYOUT.embedding_name(0), 0, 2)
    RpcEndpoint.leave()


def batches(gen: torch.Generator, n: int):
    for _ in range(n):
        yield None, (torch.rand(BATCH, TABLES, generator=gen) ** 4 * ROWS).long(), None


def compute(a: torch.Tensor) -> torch.Tensor:
    for _ in range(6):
        a = torch.tanh(a @ a) * 0.5
    return a


def block(client: RemoteEmbeddings, depth: int, steps: int,
          gen: torch.Generator) -> tuple[float, float]:
    """Median seconds of a step and of its wait for rows, over `steps` steps."""
    pipe = RowPipeline(client, depth, batches(gen, steps + depth + 1))
    a = torch.randn(160, 160, generator=gen)
    took, waited = [], []
    t = time.perf_counter()
    for _ in range(steps):
        w = time.perf_counter()
        vectors = pipe.rows()
        waited.append(time.perf_counter() - w)
        compute(a)
        pipe.advance(torch.full_like(vectors, 1e-3), True, 1.0)
        now = time.perf_counter()
        took.append(now - t)
        t = now
    pipe.drop()
    client.flush()
    return statistics.median(took), statistics.median(waited)


def client_main(port: int, rounds: int, steps: int, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    client = RemoteEmbeddings(PLAN, LAYOUT, RpcEndpoint("127.0.0.1", port), DIM,
                              {"trainer0": 1}, transport="rpc")
    client.attach("trainer0")
    gen = torch.Generator().manual_seed(0)
    out: dict[int, list[tuple[float, float]]] = {d: [] for d in DEPTHS}
    for r in range(rounds + 1):
        for d in DEPTHS:
            got = block(client, d, steps, gen)
            if r:  # round 0 warms up
                out[d].append(got)
    client.detach()
    results.put(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    port, results = free_port("127.0.0.1"), ctx.Queue()
    procs = [ctx.Process(target=server, args=(port,)),
             ctx.Process(target=client_main, args=(port, args.rounds, args.steps, results))]
    for p in procs:
        p.start()
    out = results.get(timeout=3600)
    for p in procs:
        p.join(timeout=60)
    base = [s for s, _ in out[0]]
    for d in DEPTHS:
        took = [s for s, _ in out[d]]
        ratios = [b / s for b, s in zip(base, took)]
        print(f"depth {d}: step {statistics.median(took) * 1e3:.2f} ms "
              f"({min(took) * 1e3:.2f}-{max(took) * 1e3:.2f} over blocks), waiting for rows "
              f"{statistics.median(w for _, w in out[d]) * 1e3:.2f} ms; steps/s vs depth 0 "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
