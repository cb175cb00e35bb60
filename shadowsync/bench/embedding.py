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

Multi-hot features next to single ids: the same 26 tables fed bags of 1 to 7 ids (4 on
average, drawn from the same skewed ids; odd tables mean-pooled, even ones weighted sums).
For `rpc`, `shm` and `local`, each kind of batch is timed alone for its lookups (pooled
vectors back) and for its updates (pooled gradients spread to every id and applied, waited
for), interleaved in the same repeats: ids looked up and updated per second, and the
multi-hot rate over the single-id rate.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

from shadowsync.bench.common import print_table, write_bench
from shadowsync.cluster.launch import free_port
from shadowsync.config import TrainConfig
from shadowsync.data.bags import Bags
from shadowsync.data.synth import generate
from shadowsync.embeddings import EmbeddingTables
from shadowsync.models.dlrm import DLRMDense, ModelConfig
from shadowsync.train.worker import make_dense_optimizer
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.rpc import RpcEndpoint
from shadowsync.transport.servers.embedding import client as emb_client
from shadowsync.transport.servers.embedding import server as emb
from shadowsync.transport.servers.embedding.plan import ShardingPlan
from shadowsync.transport.servers.embedding.server import release, serve

MODES = ("rpc", "shm", "local", "echo", "ping")
TABLES, ROWS, DIM, BATCH = 26, 100_000, 16, 256
BAG_LENGTHS = (1, 8)  # a multi-hot bag holds 1 to 7 ids
KINDS = ("single", "multi")
JAGGED_MODES = ("rpc", "shm", "local")


def multi_hot_batches(cats: torch.Tensor, batches: int, seed: int = 0) -> list[Any]:
    """`batches` batches of BATCH examples whose every table gets a bag of ids drawn from that
    table's column of `cats` (as skewed as single ids), odd tables mean-pooled, even ones
    weighted sums."""
    gen = torch.Generator().manual_seed(seed)
    column = cats.t().contiguous()  # [TABLES, rows]
    out = []
    for _ in range(batches):
        multi = []
        for t in range(TABLES):
            lengths = torch.randint(*BAG_LENGTHS, (BATCH,), generator=gen)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
            nnz = int(offsets[-1])
            values = column[t, torch.randint(0, column.shape[1], (nnz,), generator=gen)]
            weights = torch.rand(nnz, generator=gen) if t % 2 == 0 else None
            multi.append((values, offsets, weights, "sum" if t % 2 == 0 else "mean"))
        out.append(Bags.build(torch.empty(BATCH, 0, dtype=torch.long), multi))
    return out


def _table_optimizer() -> dict[str, Any]:
    """The default job's (row-wise Adagrad, its learning rate and starting accumulator)."""
    return TrainConfig().optim.table_optimizer()


def _server(port: int, results: Any) -> None:
    serve(ShardingPlan(1, (ROWS,) * TABLES, 10**9), 0, DIM, _table_optimizer(), seed=0)
    try:
        RpcEndpoint("127.0.0.1", port).join("emb0", 0, 2, threads=16)
        RpcEndpoint.leave()
    finally:
        release()


def _ping() -> None:
    return None


class _Client:
    """Trainer 0's side: the remote tables (over RPC, and through shared memory), a local
    copy, the dense model, and the batches and gradients every timing uses."""

    def __init__(self, port: int, steps: int) -> None:
        self.steps = steps
        data = generate(BATCH * (steps + 1), seed=0)
        self.ids = torch.from_numpy(data.cats % ROWS).split(BATCH)
        self.dense = torch.from_numpy(data.dense).split(BATCH)
        self.labels = torch.from_numpy(data.labels).split(BATCH)
        self.client = emb_client.RemoteEmbeddings(
            ShardingPlan(1, (ROWS,) * TABLES, 10**9), ClusterLayout(1, 0, 1, 0),
            RpcEndpoint("127.0.0.1", port), DIM, {"trainer0": 1})
        self.client.attach("trainer0")
        self.mapped = dict(self.client._shared)
        self.local = EmbeddingTables([ROWS] * TABLES, DIM, seed=1, **_table_optimizer())
        self.model = DLRMDense(ModelConfig(self.dense[0].shape[1], TABLES, DIM))
        self.opt = make_dense_optimizer("adagrad", self.model.parameters(), 0.01)
        gen = torch.Generator().manual_seed(0)
        self.grads = [torch.randn(BATCH, TABLES, DIM, generator=gen) * 1e-3 for _ in range(8)]
        self.kinds = {"single": self.ids,
                      "multi": multi_hot_batches(torch.from_numpy(data.cats % ROWS), steps + 1)}

    def jagged(self, mode: str, kind: str) -> dict[str, float]:
        """Lookups alone, then updates alone (each waited for), of one kind of batch."""
        client, steps, grads = self.client, self.steps, self.grads
        holder = self.local if mode == "local" else client
        client._shared = self.mapped if mode == "shm" else {}
        batches = self.kinds[kind]
        t0 = time.perf_counter()
        for i in range(steps):
            holder.lookup(batches[i])
        t1 = time.perf_counter()
        for i in range(steps):
            holder.apply_gradients(batches[i], grads[i % len(grads)])
            if mode != "local":
                client.flush()
        t2 = time.perf_counter()
        ids_per_batch = sum(len(b.ids) if kind == "multi" else b.numel()
                            for b in batches[:steps]) / steps
        return {"lookup_ms": (t1 - t0) / steps * 1e3, "update_ms": (t2 - t1) / steps * 1e3,
                "ids_per_batch": ids_per_batch,
                "lookups_per_s": ids_per_batch * steps / (t1 - t0),
                "updates_per_s": ids_per_batch * steps / (t2 - t1)}

    def run(self, mode: str) -> dict[str, float]:
        client, steps, grads, ids = self.client, self.steps, self.grads, self.ids
        prof: dict[str, float] = {}
        client.profile = prof
        client._shared = self.mapped if mode == "shm" else {}
        rpc.rpc_sync("emb0", emb._profile)  # reset the server's counters
        emb._profile()
        t0 = time.perf_counter()
        for i in range(steps):
            g = grads[i % len(grads)]
            if mode in ("rpc", "shm"):
                client.update_and_lookup(ids[i], g, ids[i + 1])
            elif mode == "local":
                self.local.update_and_lookup(ids[i], g, ids[i + 1])
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

    def dense_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        for i in range(self.steps):
            vectors = torch.zeros(BATCH, TABLES, DIM).requires_grad_()
            logits = self.model(self.dense[i], vectors)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, self.labels[i])
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return {"step": (time.perf_counter() - t0) / self.steps * 1e3}


def _client(port: int, steps: int, repeats: int, results: Any) -> None:
    torch.set_num_threads(1)
    bench = _Client(port, steps)
    runs = []
    bench.run("rpc")  # warm up both ends
    for r in range(repeats):
        for mode in MODES:
            runs.append({"variant": mode, "repeat": r, **bench.run(mode)})
        runs.append({"variant": "dense_step", "repeat": r, **bench.dense_step()})
        for mode in JAGGED_MODES:
            for kind in KINDS:
                runs.append({"variant": f"{mode}-{kind}", "repeat": r,
                             **bench.jagged(mode, kind)})
    bench.client.profile = None
    bench.client._shared = bench.mapped
    results.put(runs)
    bench.client.detach()


def run_embedding_bench(out: str, steps: int = 400, repeats: int = 3) -> dict[str, Any]:
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
    jagged_variants = [f"{m}-{k}" for m in JAGGED_MODES for k in KINDS]
    jagged_runs = [r for r in runs if r["variant"] in jagged_variants]
    runs_by_step = [r for r in runs if r["variant"] not in jagged_variants]
    variants = [*MODES, "dense_step"]
    phases = sorted({k for r in runs_by_step for k in r if k not in ("variant", "repeat")})
    med = {v: {k: statistics.median(r[k] for r in runs_by_step if r["variant"] == v)
               for k in phases if any(k in r for r in runs_by_step if r["variant"] == v)}
           for v in variants}
    rates = ("lookups_per_s", "updates_per_s", "lookup_ms", "update_ms", "ids_per_batch")
    jag = {v: {k: statistics.median(r[k] for r in jagged_runs if r["variant"] == v)
               for k in rates} for v in jagged_variants}
    spread = {v: {k: (min(r[k] for r in jagged_runs if r["variant"] == v),
                      max(r[k] for r in jagged_runs if r["variant"] == v))
                  for k in ("lookups_per_s", "updates_per_s")} for v in jagged_variants}
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
        **{f"{kind}_{what}_{mode}": jag[f"{mode}-{kind}"][what]
           for mode in JAGGED_MODES for kind in KINDS
           for what in ("lookups_per_s", "updates_per_s")},
        # ids a second with bags against single ids, through the same servers
        **{f"multi_vs_single_{what}_{mode}": (jag[f"{mode}-multi"][what]
                                              / jag[f"{mode}-single"][what])
           for mode in JAGGED_MODES for what in ("lookups_per_s", "updates_per_s")},
    }
    print_table([[v, *[med[v].get(k, float("nan")) for k in phases]] for v in variants],
                ["ms/step", *phases])
    print()
    def millions(v: str, what: str) -> list[str]:
        lo, hi = spread[v][what]
        return [f"{jag[v][what] / 1e6:.2f}", f"{lo / 1e6:.2f}-{hi / 1e6:.2f}"]

    print_table([[v, jag[v]["ids_per_batch"], *millions(v, "lookups_per_s"),
                  *millions(v, "updates_per_s")] for v in jagged_variants],
                ["ids", "ids/batch", "lookups M/s", "(min-max)", "updates M/s", "(min-max)"])
    print()
    print_table([[k, v] for k, v in ratios.items()], ["ratio", "value"])
    path = write_bench(Path(out), "embedding", runs, ratios,
                       {"steps": steps, "repeats": repeats, "medians": med,
                        "multi_hot": {"medians": jag, "spread": spread,
                                      "bag_lengths": list(BAG_LENGTHS)},
                        "shape": {"tables": TABLES, "rows": ROWS, "dim": DIM, "batch": BATCH}})
    print(f"wrote {path}")
    return {"ratios": ratios, "medians": med}
