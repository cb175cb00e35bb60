"""TorchRec's way of training the default job, as a peer for the benchmarks.

DistributedModelParallel shards an EmbeddingBagCollection (one table per categorical
feature, the job's rows and width) over 2 gloo CPU ranks with the planner's plan and
fbgemm's fused row-wise Adagrad (applied in the backward pass, as TorchRec trains; its
accumulators start where ours do, `--embedding-initial-accumulator`), and wraps
the dense DLRM (our `DLRMDense`, the same shape) in DDP. TrainPipelineSparseDist overlaps the
next batch's input distribution with the current step. Each rank reads the same rows our
trainers read: global batches of the job's batch size, alternating between the ranks; the
dense optimizer is the job's (Adagrad, same learning rate and warm-up). TorchRec 1.8 offers
no row-wise sharding on CPU, so the planner places whole tables (table-wise). fbgemm's kernels
take rows whose width is a multiple of 4, so a table as wide as ours with the id bias (17)
is padded to the next multiple (20); the model reads the job's columns, and the rates are
set so that the padded tables train exactly as ours (`fbgemm_tables`).

Training EPS counts every trained example between the ranks' common start (after a barrier)
and the last rank's end; eval NE is taken on the job's held-out rows, split over the ranks.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shadowsync.bench.peers.padded_tables import fbgemm_tables
from shadowsync.bench.peers.ranks import run_ranks
from shadowsync.config import ModelConfig, OptimConfig
from shadowsync.data.dataset import batches, num_batches
from shadowsync.metrics import evaluate_predictions
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.tasks import TaskInputs, build_dense_model, plan_data

WORLD = 2
EVAL_BATCH = 4096


class PeerJob(TaskInputs, Protocol):
    """What the TorchRec way reads of a job: the task's inputs (the data, the model's shape,
    the seed) and the optimizer (examples, batch, learning rates and their schedule). A
    `TrainConfig` is one."""

    optim: OptimConfig


def run(job: PeerJob, out: Path) -> dict[str, Any]:
    """Train `job` (data, model shape, examples, batch, learning rates) the TorchRec way on 2
    ranks; the same result keys as one of our runs, also written as `out`/summary.json."""
    plan_data(job)  # convert or generate the data once, before the ranks open it
    t0 = time.time()
    per_rank = run_ranks(_rank, WORLD, (job, job.optim))
    wall = time.time() - t0
    start = min(r["start"] for r in per_rank)
    end = max(r["end"] for r in per_rank)
    examples = sum(r["examples"] for r in per_rank)
    pred = np.concatenate([r["pred"] for r in per_rank])
    labels = np.concatenate([r["labels"] for r in per_rank])
    final = evaluate_predictions(pred, labels)
    res = {"eps": examples / (end - start), "eval_ne": final["ne"], "syncs_per_min": None,
           "sync_blocked_fraction": None, "wall_s": wall, "examples": examples,
           "teacher_eval_ne": per_rank[0]["teacher"], "eval_examples": len(labels),
           "plan": per_rank[0]["plan"],
           "accumulators_started": sum(r["accumulators_started"] for r in per_rank)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return res


def _model(inputs: TaskInputs, plan: Any, padded: int, embedding_lr: float) -> Any:
    rows = plan.features.table_rows
    width = inputs.model.table_width()
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=padded,
                                 num_embeddings=n, feature_names=[f"f{i}"],
                                 pooling=PoolingType.SUM) for i, n in enumerate(rows)]

    class Train(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
            self.dense = build_dense_model(inputs, plan.features)

        def forward(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
            pooled = self.ebc(batch.sparse_features).to_dict()
            emb = torch.stack([pooled[f"f{i}"] for i in range(len(rows))], dim=1)[..., :width]
            logits = self.dense(batch.dense_features, emb)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            return loss, logits.detach()

    model = Train()
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(),
                                {"lr": embedding_lr, "eps": 1e-8})
    return model


def start_accumulators(dmp: Any, value: float) -> int:
    """Start this rank's row-wise Adagrad accumulators (fbgemm's `momentum1`, one per row) at
    the job's `--embedding-initial-accumulator`, as our tables start; TorchRec's fused
    optimizer has no such setting. Returns the rows set."""
    rows = 0
    for state in dmp.fused_optimizer.state.values():
        for key, held in state.items():  # a ShardedTensor, or a tensor
            if not key.endswith("momentum1"):
                continue
            local = held.local_shards() if hasattr(held, "local_shards") else [held]
            for shard in local:
                tensor = getattr(shard, "tensor", shard)
                tensor.fill_(value)
                rows += tensor.numel()
    return rows


def set_embedding_lr(dmp: Any, lr: float) -> None:
    """The fused optimizer's rate for the next steps: fbgemm reads it from the param groups
    when the optimizer's `step()` is called (the pipeline only steps the dense one)."""
    for group in dmp.fused_optimizer.param_groups:
        group["lr"] = lr
    dmp.fused_optimizer.step()


def _batches(model: ModelConfig, data: Any, start: int, stop: int, batch: int, rank: int,
             steps: int, pad: bool) -> Any:
    """`steps` batches of rank `rank` (global batches alternate between the ranks), as
    TorchRec Batch objects; with `pad`, short or missing batches are padded with row
    `start` (their predictions are dropped) so both ranks take the same collective steps."""
    num_tables = data.num_tables
    keys = [f"f{i}" for i in range(num_tables)]
    it = batches(data, start, stop, batch, shard=rank, num_shards=WORLD,
                 table_size=model.table_rows(num_tables), drop_last=not pad)
    for _ in range(steps):
        dense, ids, labels = next(it, (None, None, None))
        real = 0 if dense is None else len(labels)
        if pad and real < batch:
            one = next(batches(data, start, start + 1, 1,
                               table_size=model.table_rows(num_tables)))
            fill = batch - real
            parts = [(dense, ids, labels)] if real else []
            parts.append(tuple(t.expand(fill, *t.shape[1:]).contiguous() for t in one))
            dense, ids, labels = (torch.cat(p) for p in zip(*parts))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=ids.t().reshape(-1),
            lengths=torch.ones(num_tables * len(labels), dtype=torch.int32))
        yield real, Batch(dense_features=dense, sparse_features=kjt, labels=labels)


def _rank(rank: int, world: int, port: int, inputs: TaskInputs,
          optim: OptimConfig) -> dict[str, Any]:
    """One rank of the peer's job: the task's data and model (`inputs`), the optimizer's
    rates, batch and schedule (`optim`)."""
    warnings.filterwarnings("ignore")  # TorchRec's planner and fx tracing are chatty
    for name in ("torchrec", "torch.fx", "fbgemm_gpu"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    torch.manual_seed(inputs.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        plan = plan_data(inputs)
        device = torch.device("cpu")
        padded, peer_lr, peer_accumulator = fbgemm_tables(
            inputs.model.table_width(), optim.embedding_lr, optim.embedding_initial_accumulator)
        model = _model(inputs, plan, padded, peer_lr)
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=world,
                                                             compute_device="cpu"))
        sharding = planner.collective_plan(model, pg=dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(model, device=device, plan=sharding)
        started = start_accumulators(dmp, peer_accumulator)
        dense = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(dmp.named_parameters())),
            lambda params: torch.optim.Adagrad(params, lr=optim.lr))
        pipeline = TrainPipelineSparseDist(dmp, dense, device, execute_all_batches=True)
        steps = num_batches(0, plan.train_stop, optim.batch_size, drop_last=True) // world
        # The schedule our workers follow, on both of the peer's optimizers.
        schedule = LrSchedule.of(optim).over(steps)
        dense_lr = schedule.attach(dense)
        stream = (b for _, b in _batches(inputs.model, plan.train, 0, plan.train_stop,
                                         optim.batch_size, rank, steps, pad=False))
        dist.barrier()
        start = time.time()
        done = 0
        embedding_lr = peer_lr  # what the fused optimizer was built with
        for _ in range(steps):
            pipeline.progress(stream)
            dense_lr.step()
            done += 1
            lr = peer_lr * schedule.embedding(done)
            if lr != embedding_lr:  # only inside the decay: not a cost of every timed step
                set_embedding_lr(dmp, lr)
                embedding_lr = lr
        end = time.time()
        dmp = pipeline.detach()  # plain forwards again
        # Held-out NE: the eval rows split over the ranks, padded to equal steps.
        dmp.eval()
        eval_steps = -(-num_batches(plan.eval_start, plan.eval_stop, EVAL_BATCH) // world)
        pred, labels = [], []
        with torch.no_grad():
            for real, b in _batches(inputs.model, plan.eval, plan.eval_start, plan.eval_stop,
                                    EVAL_BATCH, rank, eval_steps, pad=True):
                _, logits = dmp(b)
                pred.append(torch.sigmoid(logits[:real]).numpy())
                labels.append(b.labels[:real].numpy())
        shards = {name: str(s.sharding_type) for p in sharding.plan.values()
                  for name, s in p.items()}
        return {"start": start, "end": end, "examples": done * optim.batch_size,
                "pred": np.concatenate(pred), "labels": np.concatenate(labels),
                "teacher": plan.teacher_eval_ne, "accumulators_started": started,
                "plan": sorted(set(shards.values()))}
    finally:
        dist.destroy_process_group()
