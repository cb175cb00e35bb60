"""`shadowsync eval`: score a checkpoint's model on any data, without the job that made it.

The dense model comes from trainer 0's shard, the embeddings from the embedding servers'
shards (or trainer 0's, for a run whose tables lived in its single trainer). Loading every
part this way is also the proof that a checkpoint is complete.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shadowsync.checkpoint.store import find_checkpoint, load_shard, read_manifest
from shadowsync.errors import UserError


class ShardedTables:
    """Embedding tables read back from the servers' shards, looked up the way the servers'
    clients find rows: each (table, id) is a key of the plan's one key space, in which every
    server holds a contiguous range (`ShardingPlan.keys`)."""

    def __init__(self, plan: Any, servers: list[Any]) -> None:
        self.plan = plan
        self.servers = servers  # EmbeddingTables of each server, loaded
        self.dim = servers[0].dim
        self.keys = plan.keys()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        keys = self.keys.of(ids.long())
        starts = self.keys.starts
        server = torch.bucketize(keys, starts[1:], right=True)  # starts[s] <= key < starts[s+1]
        out = torch.empty(len(keys), self.dim)
        for s, tables in enumerate(self.servers):
            pos = (server == s).nonzero().squeeze(1)
            if len(pos):
                out[pos] = tables.lookup_rows(keys[pos] - starts[s])
        return out.view(*ids.shape, self.dim)


def load_model(step: Path) -> tuple[Any, torch.nn.Module, Any]:
    """The configuration, dense model and embedding tables saved in checkpoint `step`."""
    from shadowsync.api import resume_base
    from shadowsync.cluster.roles import embedding_plan
    from shadowsync.embeddings import EmbeddingTables
    from shadowsync.train.trainer import build_dense_model, features_of

    manifest = read_manifest(step)
    cfg = resume_base(step)
    features = features_of(cfg)
    model = build_dense_model(cfg, features)
    targets = {f"model/{k}": v for k, v in model.state_dict().items()}
    tables: Any = None
    if cfg.task == "ctr":
        servers = [s for s in manifest.get("shards", []) if s.startswith("emb")]

        def table(rows: list[int], seed: int) -> EmbeddingTables:
            return EmbeddingTables(rows, cfg.table_width(), seed=seed, **cfg.table_optimizer())

        if servers:
            plan = embedding_plan(cfg)
            held = [table(plan.server_pieces(i), 0) for i in range(len(servers))]
            for i, t in enumerate(held):
                load_shard(step / f"emb{i}", {f"state/{k}": v for k, v in t.state_dict().items()},
                           f"embedding server {i}")
            tables = ShardedTables(plan, held)
        else:
            local = table(list(features.table_rows), 0)
            targets.update({f"tables/{k}": v for k, v in local.state_dict().items()})
            tables = local
    load_shard(step / "trainer0", targets, "the dense model", strict=False)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(targets[f"model/{k}"])
    model.eval()
    return cfg, model, tables


def evaluate_checkpoint(path: str, data: str, predictions: str | None = None,
                        skip_bad_lines: bool = False) -> dict[str, Any]:
    """Metrics of the checkpoint at `path` (a run directory: its newest) on `data`: every
    row of a file or directory, or the held-out rows of the built-in data."""
    from shadowsync.metrics import evaluate_predictions
    from shadowsync.train.evaluate import predict
    from shadowsync.train.trainer import features_of, plan_data

    step = find_checkpoint(path)
    if predictions is not None:
        parent = Path(predictions).resolve().parent
        if not parent.is_dir():
            raise UserError(f"--predictions {predictions}: no directory {parent}")
    cfg, model, tables = load_model(step)
    if cfg.task == "digits" or data in ("synthetic", "digits"):
        plan = plan_data(replace(cfg, eval_data=None, data=cfg.data if cfg.task == "digits"
                                 else data))
        rows, start, stop = plan.eval, plan.eval_start, plan.eval_stop
    else:
        from shadowsync.data.dataset import open_data

        rows = open_data(data, skip_bad_lines=skip_bad_lines)
        start, stop = 0, len(rows)
        f = features_of(cfg)
        if (rows.num_dense, rows.num_tables) != (f.num_dense, f.num_tables):
            raise UserError(f"--data {data}: {rows.num_dense} dense and {rows.num_tables} "
                            f"categorical features, but the checkpoint's model takes "
                            f"{f.num_dense} and {f.num_tables}")
    if cfg.task == "digits":
        x = torch.from_numpy(np.asarray(rows.dense[start:stop]))
        y = np.asarray(rows.labels[start:stop]).astype(np.int64)
        with torch.no_grad():
            prob = torch.softmax(model(x, None), 1).numpy()
        result: dict[str, Any] = {"accuracy": float((prob.argmax(1) == y).mean())}
        pred = prob
    else:
        table_rows = cfg.table_rows(rows.num_tables)
        pred, y = predict(model, tables, rows, start, stop, table_rows)
        result = evaluate_predictions(pred, y)
    result.update({"examples": stop - start, "checkpoint": str(step)})
    if predictions is not None:
        np.save(predictions, pred)
        result["predictions"] = predictions
    return result
