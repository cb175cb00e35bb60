"""Every kind of injected straggler (`--straggler kind=...`), in one table.

Adding a kind is one module with its `StragglerKind` (`base.py`: whether it delays pushes or
slows steps, whether it slows every trainer) and one entry here."""

from __future__ import annotations

from shadowsync.spec.straggler_kinds.base import StragglerKind
from shadowsync.spec.straggler_kinds.compute import COMPUTE
from shadowsync.spec.straggler_kinds.delay import DELAY
from shadowsync.spec.straggler_kinds.jitter import JITTER

KINDS: dict[str, StragglerKind] = {k.name: k for k in (COMPUTE, DELAY, JITTER)}

__all__ = ["KINDS", "StragglerKind"]
