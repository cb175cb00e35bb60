"""What a process of a resumed (or restarted) job loads from the checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from shadowsync.checkpoint import shards
from shadowsync.checkpoint.store import load_all, published, read_manifest
from shadowsync.config import CheckpointConfig, TrainConfig
from shadowsync.lifecycle.attempts import attempt
from shadowsync.state_dicts import Checkpointable


def after_restart(cfg: TrainConfig) -> TrainConfig:
    """In a restarted attempt, `cfg` resuming from the run's newest published checkpoint (or
    from the start if it has none yet)."""
    if attempt() == 0 or not cfg.output.dir:
        return cfg
    found = published(Path(cfg.output.dir))
    return replace(cfg, resume=str(found[-1]) if found else None)


def own_shard(checkpoint: CheckpointConfig, shard: str, part: Checkpointable, what: str,
              known: bool = True) -> None:
    """Register a server's state for checkpoints and, resuming, load it. `known`: the
    tensors exist already (else they are created from the checkpoint)."""
    shards.register(shard, "state", part)
    source = checkpoint.resume or checkpoint.warm_start  # a server's state is learned
    if not source:
        return
    if known:
        shards.load_here(Path(source), shard, {"state": part}, what)
    else:
        saved = load_all(Path(source) / shard, what)
        part.load_state_dict({k.removeprefix("state/"): v for k, v in saved.items()})


def pushes_to_rewind(checkpoint: CheckpointConfig) -> int:
    """A checkpoint taken while training holds pushes past the workers' positions, which the
    resumed workers push again: the dense servers count them once (0: not resuming)."""
    if not checkpoint.resume:
        return 0
    positions = read_manifest(Path(checkpoint.resume), "--resume").get("positions") or {}
    return sum(sum(p) for p in positions.values())
