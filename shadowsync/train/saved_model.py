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
from shadowsync.config import DLRM, DataConfig, TrainConfig
from shadowsync.data.dataset import (
    CtrData,
    dense_features,
    predict_rows,
    resolve,
    sparse_features,
)
from shadowsync.errors import UserError
from shadowsync.models.build import load_factory
from shadowsync.models.trained import SparseFeature, TrainedModel
from shadowsync.runners.protocol import KEY, load_flat
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import (
    DataPlan,
    Features,
    TaskInputs,
    build_dense_model,
    features_of,
    task_of,
)
from shadowsync.transport.servers.dense import TRAINED


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
    tables: list[torch.Tensor] = []
    id_keys: list[torch.Tensor] | None = None
    if task_of(cfg.task).categorical:  # as the run's --tables kind saved them
        tables, id_keys = table_builder(cfg.model).saved_tables(
            step, cfg.model, cfg.cluster, cfg.optim.batch_size, manifest, features)
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
