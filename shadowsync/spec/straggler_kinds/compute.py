"""`kind=compute` (the default): every worker of the slowed trainers takes `slowdown` times
its own normal step time while the window is open, the transient compute straggler of
Sync-Switch's online policies (Li et al., ICDCS 2021, arXiv 2104.08364). The injection is
`shadowsync.train.straggler` (why the normal step time is frozen when the window opens:
`shadowsync.spec.straggler`)."""

from __future__ import annotations

from shadowsync.spec.straggler_kinds.base import StragglerKind

COMPUTE = StragglerKind("compute", delays_pushes=False)
