"""Ctrl-C and SIGTERM: stop training at the next step, save a final checkpoint, and exit.

Every process of a job installs `StopRequest.install` once. A trainer subscribes its
`Trainer.request_stop`; its workers then end after their current step, the job saves a
final checkpoint and shuts down as at the end of its data. A server only notes the signal:
it keeps answering until the trainers have saved and left.

A watchdog makes sure a process never outlives the request by more than `grace_s`, even if
a peer died and the orderly shutdown would wait on it: the launcher gives its processes
some time after forwarding the signal, and a user who pressed Ctrl-C expects the job gone
within seconds.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The run stopped on a signal; `checkpoint` is where its final state was saved."""

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as shells report


class StopRequest:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._subscribers: list[Callable[[int], None]] = []
        self._previous: dict[int, Any] = {}
        self._grace_s: float | None = None

    def install(self, grace_s: float | None = None) -> bool:
        """Handle SIGINT and SIGTERM in this process (main thread only). `grace_s`: exit
        that many seconds after the first signal, whatever is still running."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._grace_s = grace_s
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def subscribe(self, callback: Callable[[int], None]) -> None:
        self._subscribers.append(callback)
        if self.signum is not None:
            callback(self.signum)

    def unsubscribe(self, callback: Callable[[int], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first and self._grace_s is not None:
            timer = threading.Timer(self._grace_s, os._exit, args=(128 + signum,))
            timer.daemon = True
            timer.start()
        for callback in list(self._subscribers):
            callback(signum)  # may raise into the interrupted code (see Trainer.request_stop)


# One per process.
STOP = StopRequest()
