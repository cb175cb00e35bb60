"""A saved model as a `torch.export` program (``.pt2``) with its feature schema beside it:
what `shadowsync.export` writes (`shadowsync.inference`, which imports this module on first
use so that `import shadowsync` has no torch)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from shadowsync.errors import UserError
from shadowsync.models.trained import TrainedModel
from shadowsync.train.saved_model import load_model

EXPORT_SUFFIX = ".pt2"


def schema_path(out: str | Path) -> Path:
    return Path(str(out) + ".schema.json")


def write_program(checkpoint: str | Path, out: str | Path,
                  model: Callable[..., object] | str | None = None) -> dict[str, object]:
    """`shadowsync.export`: the checkpoint's model as a program at `out` and its schema at
    ``out.schema.json``; returns what was written, with sizes and times."""
    out = Path(out)
    if out.suffix != EXPORT_SUFFIX:
        raise UserError(f"--out {out}: an exported program is a {EXPORT_SUFFIX} file")
    if not out.resolve().parent.is_dir():
        raise UserError(f"--out {out}: no directory {out.resolve().parent}")
    t0 = time.perf_counter()
    cfg, trained, step = load_model(checkpoint, model)
    t_load = time.perf_counter() - t0
    program = export_program(trained, cfg.model.name if isinstance(cfg.model.name, str)
                             else "a factory")
    torch.export.save(program, str(out))
    schema = {**trained.schema(), "checkpoint": str(step), "format": "torch.export",
              "torch": torch.__version__,
              "inputs": program_inputs(trained),
              "returns": "logits [B]" if trained.output == "sigmoid" else "logits [B, classes]"}
    schema_path(out).write_text(json.dumps(schema, indent=1), encoding="utf-8")
    return {"out": str(out), "schema": str(schema_path(out)),
            "bytes": out.stat().st_size, "load_s": round(t_load, 3),
            "export_s": round(time.perf_counter() - t0 - t_load, 3), "checkpoint": str(step)}


def program_inputs(trained: TrainedModel) -> list[dict[str, object]]:
    """The exported program's positional inputs, in order: dense, the single-id features'
    ids, then each multi-hot feature's values, lengths [B] and, when weighted, weights."""
    single = [f.name for f in trained.features if not f.multi_hot]
    inputs = [{"name": "dense", "dtype": "float32", "shape": ["B", trained.num_dense]},
              {"name": "sparse", "dtype": "int64", "shape": ["B", len(single)],
               "features": single}]
    for f in trained.multi_hot:
        inputs += [{"name": f"{f.name}.values", "dtype": "int64", "shape": [f"nnz_{f.name}"]},
                   {"name": f"{f.name}.lengths", "dtype": "int64", "shape": ["B"]}]
        if f.weighted:
            inputs.append({"name": f"{f.name}.weights", "dtype": "float32",
                           "shape": [f"nnz_{f.name}"]})
    return inputs


def export_program(trained: TrainedModel, name: str) -> torch.export.ExportedProgram:
    """`torch.export` of the whole model, the batch dimension (and each multi-hot feature's
    number of ids) left free. Its parameters are constants of the program (no gradients: it
    scores)."""
    trained.requires_grad_(False)
    batch = torch.export.Dim("batch", min=1)
    dense = torch.zeros(4, trained.num_dense)
    sparse = torch.zeros(4, trained.num_single, dtype=torch.long)
    args: list[torch.Tensor] = []  # forward's *bags
    shapes: list[dict[int, object]] = []  # dimension -> torch.export.Dim
    for m, f in enumerate(trained.multi_hot):
        ids = torch.export.Dim(f"ids{m}")
        args += [torch.zeros(6, dtype=torch.long), torch.tensor([1, 2, 2, 1])]
        shapes += [{0: ids}, {0: batch}]
        if f.weighted:
            args.append(torch.ones(6))
            shapes.append({0: ids})
    try:
        with torch.no_grad():
            return torch.export.export(trained, (dense, sparse, *args),
                                       dynamic_shapes=({0: batch}, {0: batch},
                                                       *((tuple(shapes),) if shapes else ())),
                                       strict=False)
    except Exception as e:  # noqa: BLE001 - a model torch.export cannot trace: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UserError(f"export: torch.export cannot trace --model {name}: "
                        f"{type(e).__name__}: {first}") from None
