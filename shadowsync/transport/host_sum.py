"""Summing a buffer over trainers that share one host, through shared memory.

A background round's pace is set by the CPU it costs (`shadowsync.runners.shadow.Pace`), and
with the trainers of a local cluster on one host most of that CPU was gloo's: its AllReduce of
the dense model (57k floats, 2 trainers) took about 1.1 ms of a trainer's CPU in the job,
against about 0.1 ms for the arithmetic. Trainers on one host instead write their buffer into
a slot of a file under /dev/shm that every trainer has mapped, meet at one gloo barrier, and
each adds up every slot itself, in trainer order, so every trainer gets bitwise the same sum.

Each trainer has two slots and uses them in turn (round k writes slot k % 2): a trainer
that writes slot k % 2 again, in round k + 2, has passed round k + 1's barrier, which every
peer reached only after reading round k. So one barrier a round is enough.
Trainers on different hosts (or network namespaces, see `shm.host_id`) keep using collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shadowsync.transport import shm


class HostSum:
    """Every trainer's float32 slot of one size, summed, on every trainer. Made by `open` on
    all trainers at once (it is a collective); None where they are on different hosts or
    shared memory is unavailable."""

    def __init__(self, group: dist.ProcessGroup | None, slots: list[torch.Tensor],
                 index: int) -> None:
        self.group = group
        self.slots = slots  # per trainer: [2, numel], every trainer's mapped here
        self.numel = slots[0].shape[1]
        self.index = index
        self.rounds = 0

    @staticmethod
    def file_bytes(numel: int) -> int:
        """The size of each trainer's file: two float32 slots of `numel`."""
        return 2 * numel * 4

    @classmethod
    def open(cls, group: dist.ProcessGroup | None, trainers: int, index: int,
             numel: int) -> HostSum | None:
        path = shm.new_path(f"sync-trainer{index}") if shm.available() else None
        try:
            mine = shm.map_file(path, (2, numel), create=True) if path else None
            everyone: list[tuple[str, str | None]] = [("", None)] * trainers
            dist.all_gather_object(everyone, (shm.host_id(), path), group=group)
            usable = all(p is not None and host == shm.host_id() for host, p in everyone)
            slots = [mine if r == index else shm.map_file(p, (2, numel))  # type: ignore[arg-type]
                     for r, (_, p) in enumerate(everyone)] if usable else []
            dist.barrier(group=group)  # every trainer has mapped every file
        finally:
            if path is not None:
                shm.unlink(path)  # the mappings stay; nothing is left in /dev/shm
        return cls(group, slots, index) if usable else None

    def next_slot(self) -> torch.Tensor:
        """This trainer's slot for the next round: fill it, then call `sum`."""
        return self.slots[self.index][self.rounds % 2]

    def sum(self, out: torch.Tensor) -> torch.Tensor:
        """Once every trainer has filled its slot: the sum of all slots, into `out`."""
        slot = self.rounds % 2
        self.rounds += 1
        dist.barrier(group=self.group)
        torch.add(self.slots[0][slot], self.slots[1][slot], out=out)
        for peer in self.slots[2:]:
            out.add_(peer[slot])
        return out
