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

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `import shadowsync` stays light: torch comes with the first call
    from shadowsync.models.trained import TrainedModel

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


def export(checkpoint: str | Path, out: str | Path,
           model: Callable[..., object] | str | None = None) -> dict[str, object]:
    """Write the checkpoint's model as a `torch.export` program to `out` (``.pt2``) and its
    feature schema to ``out.schema.json``; returns what was written, with sizes and times."""
    from shadowsync.train.exported import write_program  # start-up cost: torch, on first use

    return write_program(checkpoint, out, model)
