"""A run on this machine with one trainer whose embedding tables live in shared memory."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from shadowsync.config import TrainConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.train.report import MetricsLog, plot_ne, summarize, write_summary
from shadowsync.train.trainer import Features, Trainer, plan_data, prepare_out_dir


def local_tables(cfg: TrainConfig, features: Features) -> EmbeddingTables:
    return EmbeddingTables(list(features.table_rows), cfg.embedding_dim, optimizer=cfg.optimizer,
                           lr=cfg.embedding_lr or cfg.lr, seed=cfg.seed).share_memory_()


def train_local(cfg: TrainConfig) -> dict[str, Any]:
    out = prepare_out_dir(cfg)
    plan = plan_data(cfg)
    log = MetricsLog(out / "metrics.jsonl")
    t0 = time.perf_counter()
    with tqdm(total=plan.train_stop, unit="ex", unit_scale=True, disable=not cfg.progress,
              desc="train", dynamic_ncols=True) as bar:
        trainer = Trainer(cfg, plan, local_tables(cfg, plan.features), log=log, progress=bar)
        stats = trainer.run()
    wall = time.perf_counter() - t0
    final = trainer.final_eval()
    trainer.close()
    summary = summarize(cfg, plan, [stats], final, trainer.running_ne.value, wall)
    log.write({"trainer": 0, "examples": stats.examples, "wall_s": round(wall, 3),
               "eps": summary["eps"], "train_ne": summary["train_ne"], "eval_ne": final["ne"]})
    log.close()
    summary["out"] = str(out)
    write_summary(out, summary)
    plot_ne(out, log.rows, plan.teacher_eval_ne)
    return summary
