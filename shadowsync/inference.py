"""Use a trained model: load a checkpoint into plain PyTorch, score rows, export it.

    import shadowsync
    model = shadowsync.load("runs/my-run")          # a torch.nn.Module on CPU
    clicks = model.predict(dense, sparse)             # probabilities, batched
    clicks = model.predict(dense, sparse, multi_hot={"genres": (values, offsets)})
    shadowsync.export("runs/my-run", "model.pt2")    # loads with torch alone

The export is a `torch.export` program (``.pt2``): `torch.export.load(FILE).module()` runs
it in a Python that has torch and nothing else, and no pickled Python class is read back
(TorchScript, the other choice, is deprecated in torch 2.x and scripts only a subset of
Python; a user's `--model` written for training is more often traceable than scriptable).
Its feature schema is written beside it as ``FILE.schema.json``, with the program's inputs in
order (multi-hot features: values and lengths, see docs/model-export.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shadowsync.errors import UserError

if TYPE_CHECKING:  # `import shadowsync` stays light: torch comes with the first call
    import torch

    from shadowsync.models.trained import TrainedModel

EXPORT_SUFFIX = ".pt2"


def load(path: str | Path, model: Callable[..., object] | str | None = None) -> TrainedModel:
    """The model of a run directory (its newest checkpoint) or of one checkpoint, as a plain
    `torch.nn.Module` on CPU in eval mode. `model`: the factory the run was trained with (or
    its "MODULE:FUNCTION"), needed only when it cannot be imported by name (defined in a
    notebook or a script's `__main__`).

    The model scores raw rows as the training data has them: ``model.predict(table)`` with a
    pyarrow Table, a dict of columns or a pandas DataFrame (strings and 64-bit ids included;
    see `TrainedModel.inputs`)."""
    from shadowsync.train.saved_model import load_model  # start-up cost: torch, on first use

    return load_model(path, model, option="path")[1]


def schema_path(out: str | Path) -> Path:
    return Path(str(out) + ".schema.json")


def export(checkpoint: str | Path, out: str | Path,
           model: Callable[..., object] | str | None = None) -> dict[str, object]:
    """Write the checkpoint's model as a `torch.export` program to `out` (``.pt2``) and its
    feature schema to ``out.schema.json``; returns what was written, with sizes and times."""
    import torch  # start-up cost: `import shadowsync` has no torch until it is used

    from shadowsync.train.saved_model import load_model

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
    import torch  # start-up cost: `import shadowsync` has no torch until it is used

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
