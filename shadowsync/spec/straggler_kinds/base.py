"""What a kind of injected straggler (`--straggler kind=...`) is to the rest of the code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StragglerKind:
    name: str  # as written after kind=
    # True: a network straggler, a delay on the slowed trainers' pushes and round trips
    # (`Straggler.link`, applied by `transport.delay`; only modes that push per step have
    # pushes to delay). False: the slowed workers' steps take longer (`train.straggler`).
    delays_pushes: bool
    # True: every trainer of the job is slowed, whatever trainer= or trainers= say.
    every_trainer: bool = False
