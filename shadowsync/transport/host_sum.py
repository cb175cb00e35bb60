"""Summing a buffer over trainers that share one host, through shared memory.

A background round's pace is set by the CPU it costs (`shadowsync.runners.shadow.Pace`), and
with the trainers of a local cluster on one host most of that CPU was gloo's: its AllReduce of
the dense model (57k floats, 2 trainers) took about 1.1 ms of a trainer's CPU in the job,
against about 0.1 ms for the arithmetic. Trainers on one host instead write their buffer into
a slot of a file under /dev/shm that every trainer has mapped, wait until every peer has
filled its slot too, and each adds up every slot itself, in trainer order, so every trainer
gets bitwise the same sum.

The wait is a `Doorbell`, not a collective: a trainer that has filled its slot for round k
writes its index into every peer's named pipe and reads its own until each peer has written
k times. A gloo barrier woke two of gloo's threads on each trainer and passed through TCP
(about a third of a round's CPU, 0.2-0.5 ms, each wake-up taking a core from a Hogwild
worker); the pipe is one write per peer and one read, in the sync thread itself.

Each trainer has two slots and uses them in turn (round k writes slot k % 2): a trainer
that writes slot k % 2 again, in round k + 2, has heard every peer's round k + 1, which each
peer said only after reading round k. So one word from each peer a round is enough.
Trainers on different hosts (or network namespaces, see `shm.host_id`) keep using collectives.
"""

from __future__ import annotations

import os
import select
import struct

import torch
import torch.distributed as dist

from shadowsync.transport import shm

# A peer silent this long is gone (the collectives' timeout in a job).
PEER_TIMEOUT_S = 300.0
_WORD = struct.Struct("<H")  # a trainer's index, one pipe write (atomic under PIPE_BUF)


class Doorbell:
    """Round counts heard from each peer through this trainer's named pipe (`own`, open for
    reading) and said to theirs (`peers`, open for writing)."""

    def __init__(self, index: int, own: int, peers: dict[int, int]) -> None:
        self.index = index
        self.own = own
        self.peers = peers  # peer index -> the write end of its pipe
        self.heard = dict.fromkeys(peers, 0)

    def ring(self) -> None:
        """Tell every peer: this trainer's slot for its next round is filled."""
        word = _WORD.pack(self.index)
        for fd in self.peers.values():
            os.write(fd, word)

    def wait(self, rounds: int, timeout_s: float = PEER_TIMEOUT_S) -> None:
        """Until every peer has rung `rounds` times. A peer may ring once more meanwhile (it
        is one round ahead at most); that word counts for its next round."""
        while self.heard and min(self.heard.values()) < rounds:
            ready, _, _ = select.select([self.own], [], [], timeout_s)
            if not ready:
                raise TimeoutError(f"trainer {self.index}: no word from a trainer on this host "
                                   f"for {timeout_s:.0f} s in a sync round")
            data = os.read(self.own, 4096)  # whole words: each write is atomic
            for (peer,) in _WORD.iter_unpack(data):
                self.heard[peer] += 1

    @staticmethod
    def make(path: str) -> int:
        """This trainer's pipe at `path`, open for reading (read-write: never blocks, and no
        end of file when a peer closes its end)."""
        os.mkfifo(path, 0o600)
        return os.open(path, os.O_RDWR)

    @staticmethod
    def reach(path: str) -> int:
        """A peer's pipe (made and open for reading by its owner), open for writing."""
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)


class HostSum:
    """Every trainer's float32 slot of one size, summed, on every trainer. Made by `open` on
    all trainers at once (it is a collective); None where they are on different hosts or
    shared memory is unavailable."""

    def __init__(self, group: dist.ProcessGroup | None, slots: list[torch.Tensor],
                 index: int, bell: Doorbell) -> None:
        self.group = group
        self.slots = slots  # per trainer: [2, numel], every trainer's mapped here
        self.numel = slots[0].shape[1]
        self.index = index
        self.bell = bell
        self.rounds = 0

    @staticmethod
    def file_bytes(numel: int) -> int:
        """The size of each trainer's file: two float32 slots of `numel`."""
        return 2 * numel * 4

    @classmethod
    def open(cls, group: dist.ProcessGroup | None, trainers: int, index: int,
             numel: int) -> HostSum | None:
        path = shm.new_path(f"sync-trainer{index}") if shm.available() else None
        pipe = f"{path}.bell" if path else None
        try:
            mine = shm.map_file(path, (2, numel), create=True) if path else None
            own = Doorbell.make(pipe) if pipe else None
            everyone: list[tuple[str, str | None]] = [("", None)] * trainers
            dist.all_gather_object(everyone, (shm.host_id(), path), group=group)
            usable = all(p is not None and host == shm.host_id() for host, p in everyone)
            slots = [mine if r == index else shm.map_file(p, (2, numel))  # type: ignore[arg-type]
                     for r, (_, p) in enumerate(everyone)] if usable else []
            peers = {r: Doorbell.reach(f"{p}.bell") for r, (_, p) in enumerate(everyone)
                     if r != index} if usable else {}
            dist.barrier(group=group)  # every trainer has mapped every file, opened every pipe
        finally:
            if path is not None:
                shm.unlink(path)  # the mappings stay; nothing is left in /dev/shm
            if pipe is not None:
                shm.unlink(pipe)
        if not usable:
            return None
        assert own is not None
        return cls(group, slots, index, Doorbell(index, own, peers))

    def next_slot(self) -> torch.Tensor:
        """This trainer's slot for the next round: fill it, then call `sum`."""
        return self.slots[self.index][self.rounds % 2]

    def sum(self, out: torch.Tensor) -> torch.Tensor:
        """Once every trainer has filled its slot: the sum of all slots, into `out`."""
        slot = self.rounds % 2
        self.rounds += 1
        self.bell.ring()
        self.bell.wait(self.rounds)
        torch.add(self.slots[0][slot], self.slots[1][slot], out=out)
        for peer in self.slots[2:]:
            out.add_(peer[slot])
        return out
