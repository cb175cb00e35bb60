"""Roles from ranks and the names processes join RPC under.

It sits below `transport/` and `train/`, which name their peers by it, and `cluster/`, which
launches the processes.

The launcher (torchrun, or the same elastic agent started in-process) gives every process a
global rank, each host's ranks consecutive (torchrun: host h of H, n processes each, runs
ranks [h n, (h + 1) n)). Where the embedding servers go is the placement:

- `first` (the default): ranks [0, E) are embedding parameter servers, [E, E + D) dense
  parameter servers, and the rest trainers, so the servers sit on the first host(s).
- `per-host`: every host runs the same roles, E/H embedding servers, D/H dense servers and
  T/H trainers in that order: rank r is on host h = r // n at slot s = r mod n, and is
  embedding server h E/H + s for s < E/H, dense server h D/H + (s - E/H) for s < (E + D)/H,
  else trainer h T/H + (s - (E + D)/H). Each trainer then reaches its own host's servers
  through shared memory and only the others' rows over RPC. On one host it is `first`.

Each trainer's Hogwild workers are not launcher ranks: they are child processes of their
trainer, but they join the RPC world (to reach the embedding servers) at ranks after every
launcher rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from shadowsync.errors import UserError

PLACEMENTS = ("first", "per-host")
PER_HOST = "per-host"


@dataclass(frozen=True)
class ClusterLayout:
    embedding_servers: int
    dense_servers: int
    trainers: int
    workers: int
    hosts: int = 1  # the launcher's hosts (agents), each with world_size / hosts processes
    placement: str = "first"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {self.hosts}")

    @property
    def world_size(self) -> int:
        """Processes the launcher starts."""
        return self.embedding_servers + self.dense_servers + self.trainers

    @property
    def rpc_world_size(self) -> int:
        return self.world_size + self.trainers * self.workers

    @property
    def _blocks(self) -> int:
        """Equal blocks of consecutive ranks, each with the same roles in the same order."""
        return self.hosts if self.placement == PER_HOST else 1

    def check(self) -> None:
        """A one-line UserError where the placement cannot be met on these hosts."""
        if self.placement != PER_HOST or self.hosts == 1:
            return
        h = self.hosts
        if self.embedding_servers < h or self.embedding_servers % h:
            raise UserError(f"--embedding-placement per-host on {h} hosts needs one or more "
                            f"embedding servers on each: give --embedding-servers a multiple "
                            f"of {h} (got {self.embedding_servers})")
        for flag, n in (("trainers", self.trainers), ("dense-servers", self.dense_servers)):
            if n % h:
                raise UserError(f"--embedding-placement per-host on {h} hosts: --{flag} {n} "
                                f"does not divide over them (every host runs the same roles; "
                                f"give a multiple of {h})")

    def role(self, rank: int) -> tuple[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        b = self._blocks
        e, d, t = self.embedding_servers // b, self.dense_servers // b, self.trainers // b
        block, slot = divmod(rank, e + d + t)
        if slot < e:
            return "embedding", block * e + slot
        if slot < e + d:
            return "dense", block * d + slot - e
        return "trainer", block * t + slot - e - d

    def _rank_of(self, index: int, per_block: int, offset: int) -> int:
        block, i = divmod(index, per_block)
        return block * (self.world_size // self._blocks) + offset + i

    def embedding_rank(self, server: int) -> int:
        return self._rank_of(server, self.embedding_servers // self._blocks, 0)

    def dense_rank(self, server: int) -> int:
        b = self._blocks
        return self._rank_of(server, self.dense_servers // b, self.embedding_servers // b)

    def trainer_rank(self, trainer: int) -> int:
        b = self._blocks
        return self._rank_of(trainer, self.trainers // b,
                             (self.embedding_servers + self.dense_servers) // b)

    @property
    def trainer_ranks(self) -> list[int]:
        return [self.trainer_rank(t) for t in range(self.trainers)]

    def host_of(self, rank: int) -> int | None:
        """The host (launcher agent) `rank` runs on; None where hosts differ in size."""
        if self.world_size % self.hosts:
            return None
        return rank // (self.world_size // self.hosts)

    def describe(self) -> str:
        """Which rank plays which role on which host, in one line per host."""
        names = {"embedding": self.embedding_name, "dense": self.dense_name,
                 "trainer": self.trainer_name}
        lines: dict[int | None, list[str]] = {}
        for rank in range(self.world_size):
            role, index = self.role(rank)
            lines.setdefault(self.host_of(rank), []).append(f"{names[role](index)}={rank}")
        return "; ".join(f"{'all hosts' if host is None else f'host {host}'}: {' '.join(roles)}"
                         for host, roles in lines.items())

    def worker_rpc_rank(self, trainer: int, worker: int) -> int:
        return self.world_size + trainer * self.workers + worker

    @staticmethod
    def embedding_name(i: int) -> str:
        return f"emb{i}"

    @staticmethod
    def dense_name(i: int) -> str:
        return f"dense{i}"

    @staticmethod
    def trainer_name(t: int) -> str:
        return f"trainer{t}"

    @staticmethod
    def worker_name(t: int, k: int) -> str:
        return f"trainer{t}-worker{k}"
