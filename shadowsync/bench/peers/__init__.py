"""Other libraries' ways of training the same job, run beside ours by the benchmarks.

Each peer lives in its own module and needs packages of the optional `peers` extra (see the
README for the install command); `missing(name)` says in one line why a peer cannot run
here, and the benchmarks skip it with that line. A peer run returns the same keys as one of
our runs (`eps`, `eval_ne`, `wall_s`, `examples`, ...), so the bench compares them alike. A
peer module may define `unavailable() -> str | None` for needs beyond installed packages.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowsync.config import TrainConfig


@dataclass(frozen=True)
class Peer:
    name: str
    what: str
    needs: tuple[str, ...]  # importable module names
    module: str  # shadowsync.bench.peers.<module>, with run(cfg, out) -> dict


PEERS: dict[str, Peer] = {
    "torchrec": Peer("torchrec", "TorchRec 1.8 DistributedModelParallel (fused row-wise "
                     "Adagrad, DDP dense, 2 gloo ranks)", ("torchrec", "fbgemm_gpu"),
                     "torchrec_dmp"),
    "torchft": Peer("torchft", "torchft LocalSGD of the dense model (--sync torchft-ma) in a "
                    "private network namespace", ("torchft",), "torchft_localsgd"),
}

INSTALL_HINT = "install the optional peers as the README's 'Peers' section says"


def missing(name: str) -> str | None:
    """None when the peer can run here, else one line saying why not."""
    peer = PEERS[name]
    absent = [m for m in peer.needs if importlib.util.find_spec(m) is None]
    if absent:
        return (f"peer {name} skipped: {', '.join(absent)} not installed ({INSTALL_HINT})")
    check = getattr(importlib.import_module(f"shadowsync.bench.peers.{peer.module}"),
                    "unavailable", None)
    reason = check() if check is not None else None
    return f"peer {name} skipped: {reason}" if reason else None


def runner(name: str) -> Callable[[TrainConfig, Path], dict[str, Any]]:
    """The peer's run(cfg, out) -> result, imported only when it is used."""
    module = importlib.import_module(f"shadowsync.bench.peers.{PEERS[name].module}")
    return module.run
