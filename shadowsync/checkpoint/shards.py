"""The state one process contributes to a checkpoint, and the RPC functions that save it.

Each process registers its stateful components under one shard name (``trainer0``,
``emb0``, ``dense0``); a component is `Checkpointable` (``state_dict() -> {name: tensor}`` and
``load_state_dict(state)``). The shard is written while training goes on: tensors updated
Hogwild are saved live, and a component whose parts must agree (a dynamic table's id map,
which other processes change under its lock) returns a copy taken under that lock.

A trainer also registers its workers' positions (`Positions`: ``mark()`` remembers where the
readers are, called on every trainer before any process saves; ``info()`` is plain data for
the manifest). `save_here` runs in that process, called directly or by RPC from trainer 0.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed.rpc as rpc

from shadowsync.checkpoint.storage import Location, location
from shadowsync.checkpoint.store import checkpoint_library, load_shard, save_shard, space_short
from shadowsync.lifecycle.stop import STOP, silence_stderr
from shadowsync.rules.average import RunningAverage
from shadowsync.state_dicts import Checkpointable, nest, part


class Positions(Checkpointable, Protocol):
    """Where a trainer's workers are, as a checkpoint records them."""

    def mark(self) -> None: ...

    def info(self) -> dict[str, object]: ...


_SHARD: str | None = None
_COMPONENTS: dict[str, Checkpointable] = {}
_POSITIONS: dict[str, Positions] = {}
# What a model average takes of each component (None: every floating tensor): the dense
# model, and the rows of fixed tables, a trainer's own or a server's. Optimizer state,
# positions, random state and a sync rule's state stay the trained model's.
AVERAGED: dict[str, tuple[str, ...] | None] = {"model": None, "tables": ("weight",),
                                               "state": ("weight",)}
_AVERAGE = RunningAverage()


def register_positions(shard: str, name: str, positions: Positions) -> None:
    """Make the workers' `positions` part of shard `shard`, marked before every save."""
    register(shard, name, positions)
    _POSITIONS[name] = positions


def register(shard: str, name: str, component: Checkpointable) -> None:
    """Make `component` part of this process's shard `shard`."""
    global _SHARD
    checkpoint_library()  # imported now, not in the first save: seconds

    if _SHARD is not None and _SHARD != shard:
        _COMPONENTS.clear()
        _POSITIONS.clear()
    _SHARD = shard
    _COMPONENTS[name] = component


def clear() -> None:
    global _SHARD, _AVERAGE
    _SHARD = None
    _COMPONENTS.clear()
    _POSITIONS.clear()
    _AVERAGE = RunningAverage()


def _merged() -> dict[str, torch.Tensor]:
    return {f"{name}/{key}": value for name, comp in _COMPONENTS.items()
            for key, value in comp.state_dict().items()}


def _learned(name: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of component `name`'s `state` that a model average takes (`AVERAGED`)."""
    keys = AVERAGED[name]
    return {k: v for k, v in state.items()
            if v.is_floating_point() and (keys is None or k in keys)}


def fold_average_here() -> int:
    """Fold this process's part of the model, as it is now, into its running average; the
    snapshots folded so far."""
    _AVERAGE.fold({f"{name}/{k}": v for name, comp in _COMPONENTS.items() if name in AVERAGED
                   for k, v in _learned(name, comp.state_dict()).items()})
    return _AVERAGE.count


def swap_average_here() -> None:
    """Put this process's part of the model and its running average in each other's place
    (twice: back as they were). The components load their whole state, the rest as it is."""
    states = {name: comp.state_dict() for name, comp in _COMPONENTS.items() if name in AVERAGED}
    average = _AVERAGE.exchange({f"{name}/{k}": v for name, state in states.items()
                                 for k, v in _learned(name, state).items()})
    for name, state in states.items():
        _COMPONENTS[name].load_state_dict({**state, **part(average, f"{name}/")})


def keep_alive() -> None:
    """Trainer 0 is saving the final checkpoint of a stopped job: wait for it."""
    STOP.extend()


def mark_here() -> None:
    """Remember reader positions now: what a later save says was trained."""
    STOP.extend()
    for positions in _POSITIONS.values():
        positions.mark()


def save_here(staging: str) -> dict[str, object]:
    """Save this process's shard under `staging`; returns its manifest entry. A tensor that is
    not finite is reported, and the coordinator then refuses to publish the checkpoint."""
    assert _SHARD is not None, "nothing registered for checkpoints in this process"
    STOP.extend()
    state = _merged()

    def not_finite() -> list[str]:
        return [k for k, v in state.items()
                if v.is_floating_point() and not bool(v.isfinite().all())]

    bad = not_finite()
    info: dict[str, object] = {"shard": _SHARD, "not_finite": bad[:5]}
    for name, positions in _POSITIONS.items():
        info[name] = positions.info()
    here = location(staging) / _SHARD
    short = space_short(here, state) if not bad else None
    if short:
        info["no_space"] = short
    elif not bad:
        save_shard(here, state)
        # The tensors are live (Hogwild workers train on while they are written): a NaN that
        # came during the write may be in the files, and stays in the tensors. Look again.
        info["not_finite"] = not_finite()[:5]
    return info


def load_here(step: Location | str, shard: str, components: dict[str, Checkpointable], what: str,
              strict: bool = True) -> None:
    """Load `components` (this process's, registered under `shard`) from checkpoint `step`;
    not `strict`: the shard may hold other components too."""
    targets: dict[str, object] = {}
    for name, comp in components.items():
        targets.update(nest(f"{name}/", comp.state_dict()))
    load_shard(location(step) / shard, targets, what, strict=strict)
    for name, comp in components.items():
        comp.load_state_dict(part(targets, f"{name}/"))


def exit_soon(code: int, delay_s: float = 0.2) -> None:
    """End this process shortly (after the RPC that asked for it has been answered): the
    job's final checkpoint is published, so an orderly RPC shutdown would only cost time."""
    silence_stderr()  # peers closing their connections would each print a warning
    threading.Timer(delay_s, os._exit, args=(code,)).start()


def end_job(names: list[str], code: int, quiet: list[str] = (), timeout_s: float = 5.0) -> None:
    """Ask the processes called `names` to exit with `code` (a stopped job, saved). First
    every process of `names` and `quiet` (the Hogwild workers, which follow their trainer)
    stops writing to stderr: one leaving would make each of the others print a warning."""
    def call_all(fn: Callable[..., object], targets: list[str], *args: object) -> None:
        futs = [rpc.rpc_async(n, fn, args=args, timeout=timeout_s) for n in targets]
        for fut in futs:
            try:
                fut.wait()
            except Exception:  # noqa: BLE001 - already gone is fine
                pass

    call_all(silence_stderr, [*names, *quiet])
    call_all(exit_soon, names, code)
