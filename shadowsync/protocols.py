"""The names of the parameter-server protocols (`bsp`, `asp`), defined once here, in a leaf
module of the base layer that imports nothing (not even torch), so the rules, the servers
(`transport`) and the runners can all name them without a string. The sync-mode registry
(`spec.modes`) re-exports it; no other module spells a protocol."""

from __future__ import annotations

from enum import Enum


class Protocol(str, Enum):
    """How a step's gradient reaches the dense parameter servers (Sync-Switch's two protocols)."""

    BSP = "bsp"  # bulk-synchronous: the servers apply one mean gradient of every worker
    ASP = "asp"  # asynchronous: each worker's gradient applied on arrival, with its staleness

    # In text (messages, logs, f-strings) a protocol is the plain string it stands for, as it
    # was before it was an enum (Python 3.11 would print "Protocol.BSP").
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
