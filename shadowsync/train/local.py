"""A run on this machine with one trainer whose embedding tables live in shared memory."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from shadowsync.config import TrainConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.train.report import MetricsLog, plot_ne, summarize, write_summary
from shadowsync.train.tasks import task_of
from shadowsync.train.trainer import Trainer, prepare_out_dir


def local_tables(cfg: TrainConfig) -> EmbeddingTables:
    return EmbeddingTables(task_of(cfg.task).table_rows(cfg), cfg.embedding_dim,
                           optimizer=cfg.optimizer, lr=cfg.embedding_lr or cfg.lr,
                           seed=cfg.seed).share_memory_()


def train_local(cfg: TrainConfig) -> dict[str, Any]:
    out = prepare_out_dir(cfg)
    plan = task_of(cfg.task).plan_data(cfg)
    log = MetricsLog(out / "metrics.jsonl")
    t0 = time.perf_counter()
    with tqdm(total=plan.train_stop, unit="ex", unit_scale=True, disable=not cfg.progress,
              desc="train", dynamic_ncols=True) as bar:
        trainer = Trainer(cfg, plan, local_tables(cfg), log=log, progress=bar)
        stats = trainer.run()
    wall = time.perf_counter() - t0
    final = trainer.final_eval()
    trainer.close()
    summary = summarize(cfg, plan, [stats], final, trainer.running.value, wall)
    log.write({"trainer": 0, "examples": stats.examples, "wall_s": round(wall, 3),
               "eps": summary["eps"], f"train_{trainer.running.name}": trainer.running.value,
               f"eval_{trainer.task.metric}": final[trainer.task.metric]})
    log.close()
    summary["out"] = str(out)
    write_summary(out, summary)
    plot_ne(out, log.rows, plan.teacher_eval_ne)
    return summary
