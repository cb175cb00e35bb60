"""What trainer 0's validations decide for every trainer of a --val-share job: the
learning-rate decay starts (--lr-decay-on-plateau), training ends (--early-stop).

Each trainer hands its workers, its own child processes, an event for each (`Notices`); a
worker looks at them between its steps. Trainer 0 sets its own and asks each other trainer
over RPC to set its own (`decay_here`, `stop_here`), as it releases them at the validation
points (`shadowsync.train.quiesce`): nothing goes through OUT, so a trainer on a host with an
OUT of its own is told as the others are.

One file stays, OUT/.lr-decay (`DECAY_RECORD`), written by trainer 0 when the decay starts:
a later attempt of the job (--max-restarts, --resume), whose processes never met this
attempt's, learns from it that the decay had started, and starts it again at its first steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path

from shadowsync.errors import PeerLost
from shadowsync.train.quiesce import tell_trainers

DECAY_RECORD = ".lr-decay"


@dataclass(frozen=True)
class Notices:
    """One trainer's events, read by its workers."""

    stop: Event | None = None  # stop after the current step (None: the mode cannot stop early)
    decay: Event | None = None  # --lr-decay-on-plateau: the decay starts


_HERE: Notices | None = None  # this process's trainer's, set by trainer 0 over RPC


def serve_notices(notices: Notices) -> None:
    """Make `notices` the ones trainer 0 sets over RPC (before the job meets)."""
    global _HERE
    _HERE = notices


def stop_here() -> None:
    """Over RPC, from trainer 0: this trainer's workers stop after their current step."""
    if _HERE is not None and _HERE.stop is not None:
        _HERE.stop.set()


def decay_here() -> None:
    """Over RPC, from trainer 0: this trainer's workers start the learning-rate decay."""
    if _HERE is not None and _HERE.decay is not None:
        _HERE.decay.set()


class JobNotices:
    """Trainer 0's side: set a notice in every trainer of the job, its own (`own`) and the
    others (RPC names `peers`); `out` keeps the decay's record."""

    def __init__(self, own: Notices, peers: list[str], out: Path) -> None:
        self.own, self.peers = own, peers
        self.record = out / DECAY_RECORD if own.decay is not None else None

    def begin(self, resumed: bool) -> None:
        """Once the job has met: a resumed attempt starts the decay again where its run had
        started it; a new run forgets a record left in OUT by another."""
        if self.record is None:
            return
        if resumed and self.record.exists():
            self._set(self.own.decay, decay_here)
        elif not resumed:
            self.record.unlink(missing_ok=True)

    def start_decay(self) -> bool:
        """The learning-rate decay starts in every trainer; False if it had already."""
        if self.own.decay is None or self.own.decay.is_set():
            return False
        assert self.record is not None
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.touch()
        self._set(self.own.decay, decay_here)
        return True

    def stop(self) -> None:
        """Every trainer's workers stop after their current step."""
        self._set(self.own.stop, stop_here)

    def _set(self, event: Event | None, here: Callable[[], None]) -> None:
        if event is not None:
            event.set()
        try:
            tell_trainers(self.peers, here)
        except RuntimeError as e:  # its workers would train on: the attempt is lost anyway
            raise PeerLost(f"a trainer was not told what validation decided: {e}") from None
