"""Dense parameter servers: named flat tensors sharded in contiguous pieces over D servers.

They hold the centre variable of elastic averaging (EASGD). A tensor is created by the first
trainer that asks (all trainers start from the same weights, so whichever arrives first is
right) and updated by adding deltas; `add` runs under a lock per tensor so concurrent pushes
from different trainers are never lost.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed.rpc as rpc

from shadowsync.transport.layout import ClusterLayout

# Set in each dense-server process; the RPC functions below run there.
_TENSORS: dict[str, torch.Tensor] = {}
_LOCKS: dict[str, threading.Lock] = {}
_CREATE = threading.Lock()


def _init(key: str, value: torch.Tensor) -> None:
    with _CREATE:
        if key not in _TENSORS:
            _TENSORS[key] = value.clone()
            _LOCKS[key] = threading.Lock()


def _get(key: str) -> torch.Tensor:
    return _TENSORS[key]


def _add(key: str, delta: torch.Tensor) -> None:
    with _LOCKS[key]:
        _TENSORS[key].add_(delta)


def shard_bounds(numel: int, servers: int) -> list[tuple[int, int]]:
    step = -(-numel // servers)
    return [(min(i * step, numel), min((i + 1) * step, numel)) for i in range(servers)]


class DenseServerClient:
    """One named flat tensor spread over the dense servers."""

    def __init__(self, key: str, servers: int) -> None:
        if servers < 1:
            raise ValueError("elastic averaging needs at least one dense server "
                             "(--dense-servers)")
        self.key = key
        self.servers = servers

    def _pieces(self, numel: int) -> list[tuple[str, int, int]]:
        return [(ClusterLayout.dense_name(s), lo, hi)
                for s, (lo, hi) in enumerate(shard_bounds(numel, self.servers)) if hi > lo]

    def init(self, value: torch.Tensor) -> None:
        self.numel = value.numel()
        futs = [rpc.rpc_async(name, _init, args=(self.key, value[lo:hi]))
                for name, lo, hi in self._pieces(self.numel)]
        torch.futures.wait_all(futs)

    def get(self) -> torch.Tensor:
        futs = [rpc.rpc_async(name, _get, args=(self.key,))
                for name, _, _ in self._pieces(self.numel)]
        return torch.cat(torch.futures.wait_all(futs))

    def add(self, delta: torch.Tensor) -> None:
        futs = [rpc.rpc_async(name, _add, args=(self.key, delta[lo:hi]))
                for name, lo, hi in self._pieces(self.numel)]
        torch.futures.wait_all(futs)
