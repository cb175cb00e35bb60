"""A checkpoint's model read back whole (`load_model`), and its predictions (`score`).

Where each part of the model is in a checkpoint step directory (docs/model-export.md says the
same for users):

- the dense model: trainer 0's shard, ``model/<parameter name>``; under bsp / asp / switch
  the dense servers hold the parameters the protocol trains (``state/trained/dense/params``
  of ``dense0``, ``dense1``...: one flat vector in `model.parameters()` order, cut into
  contiguous pieces in server order), and those are read instead: at a save during training
  they are newer than trainer 0's copy (at the final save both are the same);
- the embedding tables of a run with tables local to its one trainer: trainer 0's
  ``tables/weight``, every table's rows end to end in feature order;
- the tables of a run with embedding servers: ``state/weight`` of ``emb0``, ``emb1``...,
  each the rows its server holds (`ShardingPlan` says which: whole tables, and the pieces of
  row-split tables, id % servers picking the server, id // servers the row there).

With --id-bias a row has one more column, the bias of its id. Optimizer state (Adagrad
accumulators, momenta) is in the same shards and not read here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from shadowsync.checkpoint.store import (
    find_checkpoint,
    load_all,
    load_shard,
    read_manifest,
    saved_config,
)
from shadowsync.config import DLRM, ClusterConfig, DataConfig, ModelConfig, TrainConfig
from shadowsync.data.dataset import (
    CtrData,
    dense_features,
    predict_rows,
    resolve,
    sparse_features,
)
from shadowsync.embeddings.dynamic import FREE, table_of
from shadowsync.errors import UserError
from shadowsync.models.build import load_factory
from shadowsync.models.trained import SparseFeature, TrainedModel
from shadowsync.runners.protocol import KEY, load_flat
from shadowsync.train.dynamic_tables import dynamic_spec
from shadowsync.train.tasks import (
    DataPlan,
    Features,
    TaskInputs,
    build_dense_model,
    features_of,
    task_of,
)
from shadowsync.transport.servers.dense import TRAINED
from shadowsync.transport.servers.embedding.plan import ShardingPlan


def feature_names(num_tables: int) -> list[str]:
    """C1..CT, as Criteo names its categorical fields."""
    return [f"C{i + 1}" for i in range(num_tables)]


def _sparse_features(manifest: dict[str, object], data: DataConfig, num_tables: int
                     ) -> list[SparseFeature]:
    """Each table's feature: its name, and for a multi-hot one its pooling and weighting.
    From the manifest (saved since they were recorded there), else from the training data's
    headers while they are still there, else single-id features C1..CT."""
    specs = manifest.get("sparse_features")
    if specs is None and data.path != "synthetic" and Path(data.path).exists():
        try:
            specs = sparse_features(resolve(data.path, data.schema), num_tables)
        except (UserError, OSError):
            specs = None
    if specs is None or len(specs) != num_tables:
        return [SparseFeature(name) for name in feature_names(num_tables)]
    return [SparseFeature(str(s["name"]), bool(s.get("multi_hot", False)),
                          str(s.get("pooling", "sum")), bool(s.get("weighted", False)),
                          s.get("bucketize"), tuple(s.get("edges", ())))
            for s in specs]


def feature_record(task: str, plan: DataPlan) -> dict[str, object]:
    """What a checkpoint's manifest records of the training data's columns: the dense
    columns' names and each table's feature (`_sparse_features` and `_dense_names` read them
    back), so that a loaded model reads raw rows by name without the data at hand (`task`:
    --task; one without categorical features records nothing)."""
    if not task_of(task).categorical:
        return {}
    path, f = plan.train.source, plan.features
    return {"dense_features": dense_features(path, f.num_dense),
            "sparse_features": sparse_features(path, f.num_tables)}


def _dense_names(manifest: dict[str, object], num_dense: int) -> list[str] | None:
    names = manifest.get("dense_features")
    return list(names) if isinstance(names, list) and len(names) == num_dense else None


def _dynamic_tables(step: Path, model: ModelConfig, batch_size: int, features: Features
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Dynamic tables cut back into one table per feature: each feature's rows in the order
    of their keys after a default row of zeros, and those keys after key 0 (see
    `TrainedModel._rows`). Ids the maps did not hold read the default row (`batch_size`:
    the run's --batch-size, which the pools were sized by)."""
    width = model.table_width()
    servers = sorted((s for s in read_manifest(step, "--checkpoint").get("shards", [])
                      if s.startswith("emb")), key=lambda s: int(s[3:]))
    holders = ([(step / name, "state/", f"embedding server {i}")
                for i, name in enumerate(servers)] if servers
               else [(step / "trainer0", "tables/", "the embedding tables")])
    spec = dynamic_spec(model, batch_size, features, len(holders))
    keys, rows = [], []
    for where, prefix, what in holders:
        held = {f"{prefix}weight": torch.empty(spec.capacity + 1, width),
                f"{prefix}map/row_key": torch.empty(spec.capacity + 1, dtype=torch.int64)}
        load_shard(where, held, what, strict=False)
        row_key = held[f"{prefix}map/row_key"].numpy()
        live = np.flatnonzero(row_key != FREE)
        keys.append(row_key[live])
        rows.append(held[f"{prefix}weight"][torch.from_numpy(live)])
    every_key, every_row = np.concatenate(keys), torch.cat(rows)
    order = np.argsort(every_key, kind="stable")
    every_key, every_row = every_key[order], every_row[torch.from_numpy(order)]
    table = table_of(every_key)
    tables, id_keys = [], []
    for t in range(features.num_tables):
        mine = np.flatnonzero(table == t)
        tables.append(torch.cat([torch.zeros(1, width), every_row[torch.from_numpy(mine)]]))
        id_keys.append(torch.from_numpy(np.concatenate([[0], every_key[mine]])))
    return tables, id_keys


def _tables(step: Path, model: ModelConfig, cluster: ClusterConfig, manifest: dict[str, object],
            table_rows: tuple[int, ...]) -> list[torch.Tensor]:
    """Every table whole, [rows, width] each, in feature order."""
    width = model.table_width()
    servers = sorted((s for s in manifest.get("shards", []) if s.startswith("emb")),
                     key=lambda s: int(s[3:]))
    if not servers:
        fused = {"tables/weight": torch.empty(sum(table_rows), width)}
        load_shard(step / "trainer0", fused, "the embedding tables", strict=False)
        return [t.clone() for t in fused["tables/weight"].split(list(table_rows))]
    if cluster.embedding_transport == "unshared":
        raise UserError(f"checkpoint {step}: --embedding-transport unshared kept a private "
                        "copy of the tables in each trainer, and those were not saved")
    plan = ShardingPlan(len(servers), table_rows, cluster.row_split_limit)
    held = []
    for i, name in enumerate(servers):
        piece = {"state/weight": torch.empty(sum(plan.server_pieces(i)), width)}
        load_shard(step / name, piece, f"embedding server {i}", strict=False)
        held.append(piece["state/weight"])
    every = held[0] if len(held) == 1 else torch.cat(held)
    del held
    return [every[plan.table_keys(t)].clone() for t in range(len(table_rows))]


def _server_params(step: Path, manifest: dict[str, object]) -> torch.Tensor | None:
    """The dense parameters trained on the dense servers (bsp, asp, switch), or None."""
    names = sorted((s for s in manifest.get("shards", []) if s.startswith("dense")),
                   key=lambda s: int(s[5:]))
    key = f"state/{TRAINED}{KEY}/params"
    pieces = [part[key] for i, name in enumerate(names)
              if key in (part := load_all(step / name, f"dense server {i}"))]
    return torch.cat(pieces) if pieces else None


def _features(manifest: dict[str, object], inputs: TaskInputs) -> Features:
    """The model's input shape: from the manifest (saved since the shape was recorded there,
    so the data need not be at hand), else from the data's headers."""
    if "num_dense" in manifest and "table_rows" in manifest:
        return Features(int(manifest["num_dense"]), tuple(int(r) for r in manifest["table_rows"]))
    return features_of(inputs)


def _importable(name: str) -> bool:
    """Whether the --model a run was saved with can be built here: the built-in model, or a
    MODULE:FUNCTION importable from this process (not a script's __main__ or a closure)."""
    if name == DLRM:
        return True
    if name.startswith("__main__:") or "<locals>" in name:
        return False
    try:
        load_factory(name)
    except UserError:
        return False
    return True


def load_model(path: str | Path, model: Callable[..., object] | str | None = None,
               option: str = "--checkpoint") -> tuple[TrainConfig, TrainedModel, Path]:
    """The configuration, the whole model and the step directory of the checkpoint at `path`
    (a run directory: its newest). `model`: the factory the run's --model named (or its
    MODULE:FUNCTION), for one that cannot be imported here (defined in a notebook or a
    script's __main__)."""
    step = find_checkpoint(path, option)
    manifest = read_manifest(step, option)
    cfg = saved_config(step)
    if model is not None:
        cfg = replace(cfg, model=model)
    elif not _importable(cfg.model.name):
        raise UserError(f"checkpoint {step}: its model {cfg.model.name} was defined in a script "
                        "or notebook, or cannot be imported from here; pass the same factory: "
                        "--model MODULE:FUNCTION (eval, export) or "
                        "shadowsync.load(path, model=FUNCTION)")
    features = _features(manifest, cfg)
    dense = build_dense_model(cfg, features)
    state = {f"model/{k}": v for k, v in dense.state_dict().items()}
    load_shard(step / "trainer0", state, "the dense model", strict=False)
    with torch.no_grad():
        for k, v in dense.state_dict().items():
            v.copy_(state[f"model/{k}"])
    flat = _server_params(step, manifest)
    if flat is not None:
        numel = sum(p.numel() for p in dense.parameters())
        if flat.numel() != numel:
            raise UserError(f"checkpoint {step}: the dense servers hold {flat.numel()} "
                            f"parameters, the model has {numel}")
        load_flat(flat, dense.parameters())
    # The digits task has no categorical features (and one placeholder table, never read).
    id_keys = None
    if not task_of(cfg.task).categorical:
        tables = []
    elif cfg.model.table_kind.maps_ids:
        tables, id_keys = _dynamic_tables(step, cfg.model, cfg.optim.batch_size, features)
    else:
        tables = _tables(step, cfg.model, cfg.cluster, manifest, features.table_rows)
    output = task_of(cfg.task).output
    sparse = _sparse_features(manifest, cfg.data, len(tables))
    return cfg, TrainedModel(dense, {f.name: t for f, t in zip(sparse, tables, strict=True)},
                             features.num_dense, output, sparse, id_keys,
                             _dense_names(manifest, features.num_dense)), step


def score(trained: TrainedModel, rows: CtrData, start: int, stop: int,
          batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Predictions and labels of rows [start, stop) of `rows` (a `CtrData`)."""
    modulus = [0] * len(trained.table_rows) if trained.raw_ids else trained.table_rows.tolist()
    return predict_rows(rows, start, stop, modulus or [1], trained.predict, batch_size)
