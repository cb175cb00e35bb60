"""The Exchange rules use in a real job: AllReduce among trainers (through shared memory
between trainers on one host, `HostSum`), centre on dense servers.

Shutdown agreement: a background loop on one trainer must never start an AllReduce that the
others will not join, or the job hangs at exit. Every round therefore carries a "my workers
are done" flag inside the reduced buffer, and a loop stops only after a round in which every
trainer raised it; so all trainers stop after the same round.

Compressed rounds (`dtype="bf16"`): what travels is bfloat16, the parameters stay float32.
An AllReduce sends this trainer's difference from the last agreed mean (identical on every
trainer, since all computed it from the same reduced buffer), plus what rounding left out
of the previous round's difference (error feedback), so rounding errors do not accumulate;
each buffer's first round goes in float32 to agree on that reference. EASGD's pushes to the
centre go in bfloat16 too (with the same error feedback); the centre it reads is float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shadowsync.transport.host_sum import HostSum
from shadowsync.transport.servers.dense import DenseServerClient

SYNC_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Compressor:
    """float32 -> the wire dtype with error feedback: what a cast drops is added to the next
    value sent under the same key, so over many rounds nothing is lost."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._residual: dict[object, torch.Tensor] = {}

    def encode(self, key: object, value: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.float32:
            return value
        carry = self._residual.get(key)
        want = value + carry if carry is not None else value
        sent = want.to(self.dtype)
        self._residual[key] = want - sent.float()
        return sent


class TrainerExchange:
    """Implements `shadowsync.rules.Exchange` for one trainer of a job."""

    def __init__(self, group: dist.ProcessGroup | None, trainers: int,
                 centres: dict[str, DenseServerClient] | None = None,
                 dtype: str = "fp32", transport: str = "auto") -> None:
        self.group = group
        self.transport = transport  # auto: through shared memory when on one host
        self.trainers = trainers
        self.centres = centres or {}
        self.dtype = dtype
        self._wire = Compressor(SYNC_DTYPES[dtype])
        self._reference: dict[int, torch.Tensor] = {}  # last agreed mean, per AllReduce
        self._calls = 0  # AllReduces so far this round: keys the buffers across trainers
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._host_sums: dict[int, HostSum | None] = {}  # per AllReduce of the round
        self.bytes_sent = 0  # by this trainer, over all rounds
        self._done = False
        self._all_done: bool | None = None
        self._centre: DenseServerClient | None = None
        self._centre_name: str | None = None

    def begin_round(self, done: bool, group_name: str | None = None) -> None:
        self._done = done
        self._all_done = None
        self._calls = 0

    def init_centre(self, group_name: str, value: torch.Tensor) -> None:
        self.centres[group_name].init(value)

    def use_centre(self, group_name: str) -> None:
        self._centre = self.centres[group_name]
        self._centre_name = group_name

    def staging(self, numel: int) -> torch.Tensor | None:
        """Where the round's next `mean` of `numel` values sends from, if a `local` made there
        (and left alone until the round ends) can be sent as it is: this trainer's slot in
        shared memory, from the second round of float32 rounds through it. Else None."""
        host = self._host_sums.get(self._calls)
        if host is None or host.numel != numel + 1 or self._wire.dtype != torch.float32:
            return None
        return host.next_slot()[:-1]

    def mean(self, local: torch.Tensor) -> torch.Tensor:
        key = self._calls
        self._calls += 1
        flat = local.reshape(-1)
        ref = self._reference.get(key)
        wire = self._wire.dtype if ref is not None else torch.float32
        payload = self._wire.encode(key, flat - ref) if ref is not None else flat
        buf = self._outgoing(key, len(flat) + 1, wire)
        if payload.data_ptr() != buf.data_ptr():  # (else made in place: `staging`)
            buf[:-1].copy_(payload)
        buf[-1] = 1.0 if self._done else 0.0
        self.bytes_sent += buf.numel() * wire.itemsize
        total = self._sum(key, buf)
        self._all_done = round(total[-1].item()) == self.trainers
        mean = total[:-1] / self.trainers
        if ref is not None:
            mean += ref
        if self._wire.dtype != torch.float32:
            self._reference[key] = mean
            mean = mean.clone()
        return mean.view_as(local)

    def _outgoing(self, key: int, numel: int, wire: torch.dtype) -> torch.Tensor:
        """Where this trainer puts its part of AllReduce `key`: its slot in shared memory
        (float32, which holds a bf16 payload exactly) when the trainers share a host, else a
        buffer of the wire's dtype. Reused round after round."""
        host = self._host_sums.get(key)
        if key not in self._host_sums or (host is not None and host.numel != numel):
            shared = self.transport == "auto" and self.trainers > 1
            host = self._host_sums[key] = (
                HostSum.open(self.group, self.trainers, self.index, numel) if shared else None)
        return host.next_slot() if host is not None else self._buffer(("send", key), numel, wire)

    def _sum(self, key: int, buf: torch.Tensor) -> torch.Tensor:
        """Every trainer's `buf`, summed in float32, bitwise the same on every trainer:
        through shared memory (`HostSum`) or by an AllReduce."""
        host = self._host_sums[key]
        if host is not None:
            return host.sum(self._buffer(("sum", key), len(buf), torch.float32))
        dist.all_reduce(buf, group=self.group)
        return buf.float()

    def _buffer(self, name: tuple[Any, ...], numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The same tensor every round for `name`: only the exchange reads it, within a
        round."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() != numel or buf.dtype != dtype:
            buf = self._buffers[name] = torch.empty(numel, dtype=dtype)
        return buf

    def centre(self) -> torch.Tensor:
        assert self._centre is not None
        return self._centre.get()

    def add_to_centre(self, delta: torch.Tensor) -> None:
        assert self._centre is not None
        sent = self._wire.encode(("centre", self._centre_name), delta)
        self.bytes_sent += sent.numel() * sent.element_size()
        self._centre.add(sent)

    @property
    def index(self) -> int:
        """This trainer's place among the trainers."""
        return dist.get_rank(group=self.group) if self.trainers > 1 else 0

    def gather(self, values: list[float]) -> list[float]:
        """Every trainer's `values` (the same number on each), concatenated in trainer order
        (one small AllReduce)."""
        if self.trainers == 1:
            return list(values)
        n = len(values)
        buf = torch.zeros(self.trainers * n, dtype=torch.float64)
        buf[self.index * n:(self.index + 1) * n] = torch.tensor(values, dtype=torch.float64)
        self.bytes_sent += buf.numel() * buf.element_size()
        dist.all_reduce(buf, group=self.group)
        return buf.tolist()

    def every_trainer_done(self) -> bool:
        """Whether every trainer had finished training when this round began, agreed by all:
        carried by the round's first `mean`, or by a flag of its own where the round has
        none yet (EASGD, which talks to the servers)."""
        if self._all_done is None:
            flag = torch.tensor([1.0 if self._done else 0.0])
            self.bytes_sent += flag.element_size()
            dist.all_reduce(flag, group=self.group)
            self._all_done = round(flag.item()) == self.trainers
        return self._all_done

    def end_round(self) -> bool:
        """True when every trainer has finished training: this was the last round."""
        return self.every_trainer_done()
