"""shadowsync: distributed training of recommendation models with pluggable synchronization.

    import shadowsync
    result = shadowsync.train(trainers=2, sync="s-bmuf", examples=200_000)

`train`, `TrainConfig` and `RunResult` are imported on first use, so `import shadowsync`
stays light (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RunResult", "TrainConfig", "__version__", "train"]

if TYPE_CHECKING:
    from shadowsync.api import RunResult, train
    from shadowsync.config import TrainConfig

_LAZY = {"train": "shadowsync.api", "RunResult": "shadowsync.api",
         "TrainConfig": "shadowsync.config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shadowsync' has no attribute {name!r}")
