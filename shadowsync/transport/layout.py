"""Roles from ranks and the names processes join RPC under.

It sits below `transport/` and `train/`, which name their peers by it, and `cluster/`, which
launches the processes.

The launcher (torchrun, or the same elastic agent started in-process) gives every process a
global rank. Ranks [0, E) are embedding parameter servers, [E, E + D) dense parameter servers,
and the rest trainers. Each trainer's Hogwild workers are not launcher ranks: they are child
processes of their trainer, but they join the RPC world (to reach the embedding servers) at
ranks after every launcher rank.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterLayout:
    embedding_servers: int
    dense_servers: int
    trainers: int
    workers: int

    @property
    def world_size(self) -> int:
        """Processes the launcher starts."""
        return self.embedding_servers + self.dense_servers + self.trainers

    @property
    def rpc_world_size(self) -> int:
        return self.world_size + self.trainers * self.workers

    def role(self, rank: int) -> tuple[str, int]:
        e, d = self.embedding_servers, self.dense_servers
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        if rank < e:
            return "embedding", rank
        if rank < e + d:
            return "dense", rank - e
        return "trainer", rank - e - d

    def trainer_rank(self, trainer: int) -> int:
        return self.embedding_servers + self.dense_servers + trainer

    @property
    def trainer_ranks(self) -> list[int]:
        return [self.trainer_rank(t) for t in range(self.trainers)]

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
