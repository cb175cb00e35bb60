"""How a delayed link (`shadowsync.spec.delay.LinkDelay`) delays a straggling trainer's
exchanges. Both exchanges a worker waits on cross the link:
- the dense push and the parameters sent back (`runners.protocol.ProtocolHook.push`);
- the embedding round trip of each step, the step's row gradients out and the next step's
  rows in (`DelayedTables`, wrapping whatever embedding client the worker has).
A BSP step then waits D longer for that worker's gradient and its reply, an ASP step of that
worker is D longer, and its embedding reads are too.

`tc netem` where the kernel has it: `netem_available` checks at run time (in a scratch
network namespace, as root). This machine's kernel has no `netem` qdisc (only `tbf` and `htb`,
rate limits), and the jobs of `--straggler` share one host's loopback, so the delay is
emulated by sleeping where a packet would wait. What a sleep does not reproduce: TCP's own
reaction to a long round trip (a large tensor's extra round trips while its window grows),
loss and queueing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any


def sleep(seconds: float) -> float:
    if seconds > 0:
        time.sleep(seconds)
    return seconds


def _carries(ids: Any) -> bool:
    """Whether an exchange about `ids` sends anything (a job without categorical features
    looks up zero columns: nothing crosses the link)."""
    return ids is not None and getattr(ids, "numel", lambda: 1)() > 0


class DelayedTables:
    """An embedding client whose round trips cross the delayed link: each blocking exchange
    that carries ids waits `one_way()` seconds on the way out and as long on the way back.
    Everything else is the wrapped client's, but its rows are not asked for ahead: the delay
    is on the blocking round trips."""

    prefetch_depth = 0

    def __init__(self, tables: Any, one_way: Callable[[], float]) -> None:
        self.tables = tables
        self.one_way = one_way

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tables, name)

    def _round_trip(self, call: Callable[[], Any], *ids: Any) -> Any:
        if not any(_carries(i) for i in ids):
            return call()
        d = self.one_way()
        sleep(d)
        out = call()
        sleep(d)
        return out

    def lookup(self, ids: Any) -> Any:
        return self._round_trip(lambda: self.tables.lookup(ids), ids)

    def update_and_lookup(self, ids: Any, grads: Any, next_ids: Any,
                          lr_scale: float = 1.0) -> Any:
        return self._round_trip(lambda: self.tables.update_and_lookup(ids, grads, next_ids,
                                                                      lr_scale=lr_scale),
                                ids, next_ids)


def netem_available() -> bool:
    """Whether `tc ... netem` works here: tried on the loopback of a scratch network
    namespace (needs root, `ip` and `tc`); the namespace is removed after."""
    if not (shutil.which("ip") and shutil.which("tc")):
        return False
    name = f"netem-probe-{uuid.uuid4().hex[:8]}"
    run = subprocess.run
    try:
        if run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
            return False
        return run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                    "netem", "delay", "1ms"], capture_output=True).returncode == 0
    finally:
        run(["ip", "netns", "del", name], capture_output=True)


def link_kind() -> str:
    """What delays a `kind=delay` straggler's link here, said with the results."""
    if netem_available():
        return "emulated (sleeps): tc netem exists, but the job's processes share one loopback"
    return "emulated (sleeps): this kernel has no netem qdisc"
