"""`shadowsync bench hogwild`: does Hogwild scale, and what does the trainer cost?

Three variants on the same synthetic data and model, interleaved and repeated:
- trainer, 1 worker process; trainer, 2 worker processes (Hogwild over shared memory);
- a bare PyTorch loop: the same model, tables and batches in one process with no trainer
  machinery (no progress reporting, no worker process), one thread like a worker.
EPS counts examples over the span workers were training, leaving out process start-up.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from shadowsync.bench.common import interleaved, median_of, print_table, write_bench
from shadowsync.config import OptimConfig, TrainConfig
from shadowsync.data.dataset import batches, num_batches
from shadowsync.train.assembly import build_trainer
from shadowsync.train.local import local_tables
from shadowsync.train.replica import ReplicaOptions
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.tasks import TaskInputs, build_dense_model, plan_data
from shadowsync.train.worker import make_dense_optimizer


def _config(examples: int, workers: int) -> TrainConfig:
    return TrainConfig(examples=examples, workers=workers, trainers=1, embedding_servers=0,
                       sync="none", eval_points=0, progress=False, log_every=10**12)


def trainer_run(options: ReplicaOptions) -> dict[str, Any]:
    """The trainer over the task's data and model with local tables, as a local run builds
    it, trained to the end."""
    plan = plan_data(options)
    trainer = build_trainer(
        plan, local_tables(options.model, options.optim, options.seed, plan.features),
        build_dense_model(options, plan.features), data=options.data, optim=options.optim,
        cluster=options.cluster, sync=options.sync, output=options.output,
        testing=options.testing, task=options.task, seed=options.seed)
    stats = trainer.run()
    trainer.close()
    return {"eps": stats.train_eps, "examples": stats.examples,
            "workers": options.cluster.workers}


def _bare_loop(inputs: TaskInputs, optim: OptimConfig, results: Any) -> None:
    torch.set_num_threads(1)
    plan = plan_data(inputs)
    model = build_dense_model(inputs, plan.features)
    tables = local_tables(inputs.model, optim, inputs.seed, plan.features)
    opt = make_dense_optimizer(optim.optimizer, model.parameters(), optim.lr)
    # The workers' schedule, so the loops match.
    schedule = LrSchedule.of(optim).over(num_batches(0, plan.train_stop, optim.batch_size))
    lr_steps = schedule.attach(opt)
    n = steps = 0
    t0 = time.perf_counter()
    for dense, ids, labels in batches(plan.train, 0, plan.train_stop, optim.batch_size,
                                      table_size=plan.features.table_rows):
        vectors = tables.lookup(ids).requires_grad_()
        loss = F.binary_cross_entropy_with_logits(model(dense, vectors), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lr_steps.step()
        tables.apply_gradients(ids, vectors.grad, schedule.embedding(steps))
        steps += 1
        n += len(labels)
    results.put({"eps": n / (time.perf_counter() - t0), "examples": n, "workers": 1})


def bare_run(inputs: TaskInputs, optim: OptimConfig) -> dict[str, Any]:
    """One process's plain training loop over the task's data and model (`inputs`) with the
    workers' optimizer and schedule (`optim`): the trainer's ceiling."""
    ctx = mp.get_context("spawn")  # a fresh process: no state of this one
    results = ctx.Queue()
    p = ctx.Process(target=_bare_loop, args=(inputs, optim, results))
    p.start()
    out = results.get(timeout=600)
    p.join(timeout=60)
    return out


def run_hogwild_bench(out: str, examples: int = 400_000, repeats: int = 3) -> dict[str, Any]:
    base = _config(examples, 1)
    plan_data(base)  # generate the data once, outside the timings
    two = replace(base, workers=2)
    variants = {
        "trainer_1w": lambda: trainer_run(base),
        "trainer_2w": lambda: trainer_run(two),
        "bare_loop": lambda: bare_run(base, base.optim),
    }
    runs = interleaved(variants, repeats, "bench hogwild")
    med = {v: median_of(runs, v, "eps") for v in variants}
    ratios = {
        "hogwild_2v1": med["trainer_2w"] / med["trainer_1w"],
        "trainer_vs_bare": med["trainer_1w"] / med["bare_loop"],
    }
    print_table([[v, med[v]] for v in variants], ["variant", "median EPS"])
    print_table([[k, v] for k, v in ratios.items()], ["ratio", "value"])
    path = write_bench(Path(out), "hogwild", runs, ratios,
                       {"examples_per_run": examples, "repeats": repeats, "median_eps": med})
    print(f"wrote {path}")
    return {"ratios": ratios, "median_eps": med}
