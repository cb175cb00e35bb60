"""`shadowsync bench embedding`: where a training step's time goes on the embedding path.

One embedding server process and one client process (a worker's view), the default job's
shape (26 tables of 100,000 rows, 16 floats, batches of 256 planted-teacher examples, so ids
are as skewed as in training). Each step does what a worker does between two dense steps:
push this batch's summed gradients and read the next batch's rows, in one call. Modes, run
interleaved and repeated (medians of per-step milliseconds):
- `rpc`: the request travels over torch.distributed.rpc (TensorPipe) and the server applies it;
- `shm`: the same server's tables, mapped from shared memory and updated in place;
- `local`: private tables in the client (the ceiling: no sharing at all);
- `echo`: the same RPC payloads to a server function that does no work (moving the bytes
  and (de)serializing them alone), and `ping`, an RPC with no payload (the fixed round trip).
Phases come from the client's profile (`route_unique`, `sum_grads`, `send`, `wait`,
`gather`) and the server's (`apply`, `lookup`); `dense_step` is the DLRM forward, backward
and optimizer step on the same batch, for scale.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from shadowsync.bench.common import print_table, write_bench

MODES = ("rpc", "shm", "local", "echo", "ping")
TABLES, ROWS, DIM, BATCH = 26, 100_000, 16, 256


def _table_optimizer() -> dict[str, Any]:
    """The default job's (row-wise Adagrad, its learning rate and starting accumulator)."""
    from shadowsync.config import TrainConfig

    return TrainConfig().table_optimizer()


def _server(port: int, results: Any) -> None:
    from shadowsync.transport.rpc import RpcEndpoint
    from shadowsync.transport.servers.embedding import ShardingPlan, release, serve

    serve(ShardingPlan(1, (ROWS,) * TABLES, 10**9), 0, DIM, _table_optimizer(), seed=0)
    try:
        RpcEndpoint("127.0.0.1", port).join("emb0", 0, 2, threads=16)
        RpcEndpoint.leave()
    finally:
        release()


def _ping() -> None:
    return None


def _client(port: int, steps: int, repeats: int, results: Any) -> None:
    import torch.distributed.rpc as rpc

    from shadowsync.data.synth import generate
    from shadowsync.embeddings import EmbeddingTables
    from shadowsync.models.dlrm import DLRMDense, ModelConfig
    from shadowsync.train.worker import make_dense_optimizer
    from shadowsync.transport.layout import ClusterLayout
    from shadowsync.transport.rpc import RpcEndpoint
    from shadowsync.transport.servers import embedding as emb

    torch.set_num_threads(1)
    data = generate(BATCH * (steps + 1), seed=0)
    ids = torch.from_numpy(data.cats % ROWS).split(BATCH)
    dense = torch.from_numpy(data.dense).split(BATCH)
    labels = torch.from_numpy(data.labels).split(BATCH)
    client = emb.RemoteEmbeddings(emb.ShardingPlan(1, (ROWS,) * TABLES, 10**9),
                                  ClusterLayout(1, 0, 1, 0), RpcEndpoint("127.0.0.1", port),
                                  DIM, {"trainer0": 1})
    client.attach("trainer0")
    mapped = dict(client._shared)
    local = EmbeddingTables([ROWS] * TABLES, DIM, seed=1, **_table_optimizer())
    model = DLRMDense(ModelConfig(dense[0].shape[1], TABLES, DIM))
    opt = make_dense_optimizer("adagrad", model.parameters(), 0.01)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(BATCH, TABLES, DIM, generator=gen) * 1e-3 for _ in range(8)]

    def run(mode: str) -> dict[str, float]:
        prof: dict[str, float] = {}
        client.profile = prof
        client._shared = mapped if mode == "shm" else {}
        rpc.rpc_sync("emb0", emb._profile)  # reset the server's counters
        emb._profile()
        t0 = time.perf_counter()
        for i in range(steps):
            g = grads[i % len(grads)]
            if mode in ("rpc", "shm"):
                client.update_and_lookup(ids[i], g, ids[i + 1])
            elif mode == "local":
                local.update_and_lookup(ids[i], g, ids[i + 1])
            elif mode == "echo":
                done = client._requests(ids[i])
                nxt = client._requests(ids[i + 1])
                summed = client._summed(done, g)
                client._gather(nxt, {0: rpc.rpc_async("emb0", emb._echo, args=(
                    done.per_server[0][2], summed, nxt.per_server[0][2]))}, ids[i + 1])
            else:
                rpc.rpc_sync("emb0", _ping)
        total = time.perf_counter() - t0
        server = rpc.rpc_sync("emb0", emb._profile) if mode != "shm" else emb._profile()
        out = {k: v / steps * 1e3 for k, v in prof.items()}
        out["apply"] = server["apply_s"] / steps * 1e3
        out["lookup"] = server["lookup_s"] / steps * 1e3
        out["step"] = total / steps * 1e3
        client.flush()
        return out

    def dense_step() -> dict[str, float]:
        t0 = time.perf_counter()
        for i in range(steps):
            vectors = torch.zeros(BATCH, TABLES, DIM).requires_grad_()
            logits = model(dense[i], vectors)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[i])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return {"step": (time.perf_counter() - t0) / steps * 1e3}

    runs = []
    run("rpc")  # warm up both ends
    for r in range(repeats):
        for mode in MODES:
            runs.append({"variant": mode, "repeat": r, **run(mode)})
        runs.append({"variant": "dense_step", "repeat": r, **dense_step()})
    client.profile = None
    client._shared = mapped
    results.put(runs)
    client.detach()


def run_embedding_bench(out: str, steps: int = 400, repeats: int = 3) -> dict[str, Any]:
    import os
    import signal

    import torch.multiprocessing as mp

    from shadowsync.cluster.launch import free_port

    port = free_port("127.0.0.1")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_server, args=(port, results)),
             ctx.Process(target=_client, args=(port, steps, repeats, results))]
    for p in procs:
        p.start()
    try:
        runs = results.get(timeout=900)
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
    variants = [*MODES, "dense_step"]
    phases = sorted({k for r in runs for k in r if k not in ("variant", "repeat")})
    med = {v: {k: statistics.median(r[k] for r in runs if r["variant"] == v)
               for k in phases if any(k in r for r in runs if r["variant"] == v)}
           for v in variants}
    dense_ms = med["dense_step"]["step"]
    rpc_, shm_, local_ = med["rpc"], med["shm"], med["local"]
    ratios = {
        # a worker's step is dense compute plus the embedding path: the speed-up it allows
        "step_rpc_vs_local": (dense_ms + local_["step"]) / (dense_ms + rpc_["step"]),
        "step_shm_vs_local": (dense_ms + local_["step"]) / (dense_ms + shm_["step"]),
        "embedding_ms_rpc": rpc_["step"],
        "embedding_ms_shm": shm_["step"],
        "embedding_ms_local": local_["step"],
        "rpc_server_work_share": (rpc_.get("apply", 0) + rpc_.get("lookup", 0)) / rpc_["step"],
        "rpc_transport_share": (med["echo"]["wait"]) / rpc_["step"],
        "rpc_fixed_round_trip_ms": med["ping"]["step"],
    }
    print_table([[v, *[med[v].get(k, float("nan")) for k in phases]] for v in variants],
                ["ms/step", *phases])
    print()
    print_table([[k, v] for k, v in ratios.items()], ["ratio", "value"])
    path = write_bench(Path(out), "embedding", runs, ratios,
                       {"steps": steps, "repeats": repeats, "medians": med,
                        "shape": {"tables": TABLES, "rows": ROWS, "dim": DIM, "batch": BATCH}})
    print(f"wrote {path}")
    return {"ratios": ratios, "medians": med}
