"""The Exchange rules use in a real job: AllReduce among trainers, centre on dense servers.

Shutdown agreement: a background loop on one trainer must never start an AllReduce that the
others will not join, or the job hangs at exit. Every round therefore carries a "my workers
are done" flag inside the reduced buffer, and a loop stops only after a round in which every
trainer raised it; so all trainers stop after the same round.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shadowsync.transport.servers.dense import DenseServerClient


class TrainerExchange:
    """Implements `shadowsync.rules.Exchange` for one trainer of a job."""

    def __init__(self, group: dist.ProcessGroup | None, trainers: int,
                 centres: dict[str, DenseServerClient] | None = None) -> None:
        self.group = group
        self.trainers = trainers
        self.centres = centres or {}
        self._done = False
        self._all_done: bool | None = None
        self._centre: DenseServerClient | None = None

    def begin_round(self, done: bool, group_name: str | None = None) -> None:
        self._done = done
        self._all_done = None

    def init_centre(self, group_name: str, value: torch.Tensor) -> None:
        self.centres[group_name].init(value)

    def use_centre(self, group_name: str) -> None:
        self._centre = self.centres[group_name]

    def mean(self, local: torch.Tensor) -> torch.Tensor:
        buf = torch.cat([local.reshape(-1), torch.tensor([1.0 if self._done else 0.0])])
        dist.all_reduce(buf, group=self.group)
        self._all_done = round(buf[-1].item()) == self.trainers
        return (buf[:-1] / self.trainers).view_as(local)

    def centre(self) -> torch.Tensor:
        assert self._centre is not None
        return self._centre.get()

    def add_to_centre(self, delta: torch.Tensor) -> None:
        assert self._centre is not None
        self._centre.add(delta)

    def end_round(self) -> bool:
        """True when every trainer has finished training: this was the last round."""
        if self._all_done is None:  # no AllReduce carried the flag this round (EASGD only)
            flag = torch.tensor([1.0 if self._done else 0.0])
            dist.all_reduce(flag, group=self.group)
            self._all_done = round(flag.item()) == self.trainers
        return self._all_done
