"""`kind=delay,ms=30,trainers=2`: the last 2 trainers sit behind a link that adds 30 ms to
each round trip, half each way: their dense pushes and replies and their embedding round
trips. The network straggler of Sync-Switch (which used `tc netem`; `transport.delay` says
what runs here); `--sync bsp / asp / switch` only."""

from __future__ import annotations

from shadowsync.spec.straggler_kinds.base import StragglerKind

DELAY = StragglerKind("delay", delays_pushes=True)
