"""`kind=jitter,ms=10,jitter=5`: every push of every trainer is delayed by 10 +- 5 ms, a
shared network where BSP waits for the slowest push of each step."""

from __future__ import annotations

from shadowsync.spec.straggler_kinds.base import StragglerKind

JITTER = StragglerKind("jitter", delays_pushes=True, every_trainer=True)
