"""The quiescent points of a --val-share job: trainer 0 validates, and saves a new best model,
with every worker of every trainer parked at the validation point's step and every embedding
push each of them sent answered by the servers; then it releases them.

Each trainer keeps a `Parking` in shared memory, read by its workers and by its own process:

- a worker at a point's gate step (`selection.gate_step`) flushes its embedding pushes (waits
  on each push in flight), then writes the step it parked at, and waits until the point is
  released (or it stops);
- a worker that ends (its data, a stop) flushes and writes FINISHED: parked at every later gate;
- trainer 0 (`Quiescence`) validates point p once every worker of its own `Parking` and of each
  other trainer's (`parked_here`, asked over RPC) is parked at p's gate or finished; after the
  save it releases p in every trainer (`release_here`).

A parked worker cannot move until released, so once every answer is in, the job is quiescent:
no dense step and no embedding push until the release. Nothing is guessed from a quiet spell
of the step counts, and nothing goes through OUT (a host with an OUT of its own parks and is
released as the others are). Every worker parks at the same step, as lockstep modes need.
Trainer 0 releases every point (`DONE`) whenever it stops validating (its workers done, an
early stop, a signal, a failure); a trainer whose trainer 0 is gone stops on the lost peer.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
import torch.distributed.rpc as rpc

from shadowsync.errors import PeerLost

log = logging.getLogger(__name__)

FINISHED = 2**62  # a worker's parked step once it has ended: parked at every later gate
DONE = math.inf  # released past every point: trainer 0 validates no more
POLL_S = 0.005  # how often a parked worker (or a trainer asked) looks again
ASK_WAIT_S = 0.5  # a trainer asked whether it is parked answers "not yet" after this long
# A trainer that has not answered trainer 0 in this long (a question takes ASK_WAIT_S at most,
# a release none) is taken for lost, however busy the machine.
ANSWER_TIMEOUT_S = 60.0


class Parking:
    """One trainer's workers at the validation points, in shared memory: the step each is
    parked at (-1: none yet; FINISHED once it has ended) and the last point released."""

    def __init__(self, workers: int) -> None:
        self.parked = torch.full((workers,), -1, dtype=torch.long).share_memory_()
        self.released = torch.tensor([-1.0], dtype=torch.float64).share_memory_()

    # -- in a worker --
    def park(self, worker: int, step: int, point: float, flush: Callable[[], None],
             stopping: Callable[[], bool]) -> float:
        """After step `step`, at `point`'s gate: flush (every push answered), say so, and
        wait until `point` is released or the worker stops; the seconds it took."""
        t0 = time.perf_counter()
        flush()
        self.parked[worker] = step
        while float(self.released[0]) < point and not stopping():
            time.sleep(POLL_S)
        return time.perf_counter() - t0

    def finish(self, worker: int) -> None:
        """The worker has ended, its pushes flushed: it never moves again."""
        self.parked[worker] = FINISHED

    # -- in its trainer --
    def parked_at(self, gate: int) -> list[int] | None:
        """Each worker's parked step once every one is parked at `gate` or later, else None."""
        steps = [int(s) for s in self.parked]
        return steps if all(s >= gate for s in steps) else None

    def release(self, point: float) -> None:
        """The workers go on past `point` (never back: a late release of a point does not
        undo `DONE`)."""
        self.released[0] = max(float(self.released[0]), point)


_HERE: Parking | None = None  # this process's trainer's, answering trainer 0 over RPC


def serve_parking(parking: Parking | None) -> None:
    """Make `parking` the one trainer 0 asks about over RPC (before the job meets)."""
    global _HERE
    _HERE = parking


def parked_here(gate: int, wait_s: float) -> list[int] | None:
    """Over RPC, from trainer 0: this trainer's workers' parked steps once every one is
    parked at `gate` (or finished), or None if they are not within `wait_s`."""
    assert _HERE is not None, "no validation points in this trainer"
    end = time.monotonic() + wait_s
    while (steps := _HERE.parked_at(gate)) is None and time.monotonic() < end:
        time.sleep(POLL_S)
    return steps


def release_here(point: float) -> None:
    """Over RPC, from trainer 0: this trainer's workers go on past `point`."""
    assert _HERE is not None, "no validation points in this trainer"
    _HERE.release(point)


class Quiescence:
    """Trainer 0's view of the job at its validation points: its own `Parking` and the other
    trainers' (RPC names `peers`), asked at most one question each at a time."""

    def __init__(self, own: Parking, own_name: str, peers: list[str]) -> None:
        self.own, self.own_name, self.peers = own, own_name, peers
        self._gate: int | None = None
        self._asked: dict[str, torch.futures.Future] = {}
        self._answers: dict[str, list[int]] = {}

    def parked(self, gate: int) -> dict[str, list[int | None]] | None:
        """Every worker's parked step (None: it has ended), by trainer, once the whole job is
        parked at `gate` or has ended; None while any worker is not (called again until)."""
        if gate != self._gate:
            self._gate, self._asked, self._answers = gate, {}, {}
        mine = self.own.parked_at(gate)
        if mine is None:  # the other trainers are asked once this one is there
            return None
        for peer in self.peers:
            if peer not in self._answers:
                self._ask(peer, gate)
        if len(self._answers) < len(self.peers):
            return None
        return {name: [None if s == FINISHED else s for s in steps]
                for name, steps in {self.own_name: mine, **self._answers}.items()}

    def _ask(self, peer: str, gate: int) -> None:
        fut = self._asked.get(peer)
        if fut is None:
            self._asked[peer] = rpc.rpc_async(peer, parked_here, args=(gate, ASK_WAIT_S),
                                              timeout=ANSWER_TIMEOUT_S)
            return
        if not fut.done():
            return
        del self._asked[peer]
        try:
            steps = fut.wait()
        except RuntimeError as e:
            raise PeerLost(f"{peer} did not say where its workers are: {e}") from None
        if steps is not None:
            self._answers[peer] = steps

    def release(self, point: float) -> None:
        """Every worker of the job goes on past `point`; a trainer that cannot be told is
        lost (its workers would wait for ever)."""
        self.own.release(point)
        try:
            tell_trainers(self.peers, release_here, point)
        except RuntimeError as e:
            raise PeerLost(f"a trainer was not told to go on: {e}") from None

    def release_all(self) -> None:
        """Every worker of the job goes on past every point: trainer 0 validates no more
        (its workers done, an early stop, a signal, a failure). A trainer that cannot be told
        is gone, and the job stops on it anyway."""
        self.own.release(DONE)
        try:
            tell_trainers(self.peers, release_here, DONE)
        except RuntimeError as e:  # RPC not joined (a failure before the job met), a peer gone
            log.debug("release of every point not delivered: %s", e)


def tell_trainers(peers: list[str], call: Callable[..., None], *args: object) -> None:
    """Run `call(*args)` in each of the trainers `peers` over RPC, at once, and wait for
    every one (RuntimeError: one did not answer within ANSWER_TIMEOUT_S, or is gone)."""
    futs = [rpc.rpc_async(p, call, args=args, timeout=ANSWER_TIMEOUT_S) for p in peers]
    for fut in futs:
        fut.wait()
