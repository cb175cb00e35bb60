"""From `--model` and the data's feature shape to the dense model every process trains.

`--model` is `dlrm` (the default) or `MODULE:FUNCTION`; from Python it may also be the
function itself. The function is called as `FUNCTION(num_dense, num_tables, embedding_dim)`
and returns an `nn.Module` whose `forward(dense [B, D], emb [B, T, E])` returns logits [B].
Every process of a job builds its own copy (trainers, their Hogwild workers, the launcher
that checks the options). `MODULE:FUNCTION` must be importable there: a module on the path
or in the current directory. A function given from Python travels by pickle: by name where
the other processes can import it, else by value (cloudpickle; `shadowsync.by_value`), so a
factory and a model class defined in a notebook, a script's `__main__` or inside the
factory work too. The built model is handed to the worker processes the same way.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shadowsync.config import DLRM, ModelConfig, model_name
from shadowsync.errors import UserError
from shadowsync.models import dlrm

DEFAULT = DLRM


def load_factory(spec: str) -> Callable[..., nn.Module]:
    """'package.module:function' -> the function, or a one-line UserError."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"--model: {spec!r} must be dlrm or MODULE:FUNCTION")
    # As `python -m` would, and as ASGI servers do for APP:NAME: the current directory too.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"--model {spec}: cannot import module '{module_name}' ({e})") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise UserError(f"--model {spec}: module '{module_name}' has no '{attr}'")
    if not callable(obj):
        raise UserError(f"--model {spec}: '{attr}' is not callable")
    return obj


def build_model(cfg: ModelConfig, num_dense: int, num_tables: int,
                validating: bool = False) -> nn.Module:
    """The dense model `cfg.name` for data with `num_dense` dense and `num_tables` categorical
    features. `bottom_mlp`, `top_mlp`, `id_bias` and `interaction` shape the DLRM (an
    interaction left open is the one data `validating` on calls for); other models get the
    shape only."""
    embedding_dim = cfg.embedding_dim
    if cfg.name == DEFAULT:
        return dlrm.DLRMDense(dlrm.ModelConfig(
            num_dense=num_dense, num_sparse=num_tables, embedding_dim=embedding_dim,
            bottom_mlp=list(cfg.bottom_mlp), top_mlp=list(cfg.top_mlp), id_bias=cfg.id_bias,
            interaction=cfg.interaction_for(validating)))
    factory = cfg.name if callable(cfg.name) else load_factory(cfg.name)
    name = model_name(cfg.name)
    try:
        built = factory(num_dense, num_tables, embedding_dim)
    except Exception as e:
        raise UserError(f"--model {name}: building the model failed: "
                        f"{type(e).__name__}: {e}") from None
    if not isinstance(built, nn.Module):
        raise UserError(f"--model {name}: returned {type(built).__name__}, not an nn.Module")
    _check_output(built, name, num_dense, num_tables, embedding_dim)
    return built


def _check_output(model: nn.Module, name: str, num_dense: int, num_tables: int,
                  embedding_dim: int, batch: int = 2) -> None:
    """One forward pass on zeros, so a wrong shape fails here and not in every worker."""
    dense, emb = torch.zeros(batch, num_dense), torch.zeros(batch, num_tables, embedding_dim)
    try:
        with torch.no_grad():
            out = model(dense, emb)
    except Exception as e:
        raise UserError(f"--model {name}: forward(dense [{batch}, {num_dense}], emb [{batch}, "
                        f"{num_tables}, {embedding_dim}]) failed: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
    shape = tuple(getattr(out, "shape", ()))
    if not isinstance(out, torch.Tensor) or shape != (batch,):
        raise UserError(f"--model {name}: forward must return logits of shape [B] = "
                        f"[{batch}], got {list(shape) if shape else type(out).__name__}")
