"""Joining and leaving the torch.distributed.rpc world (TensorPipe)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch.distributed.rpc as rpc

from shadowsync.transport import rendezvous

RPC_TIMEOUT_S = 120.0
# Leaving is a barrier over the whole job: the others may still be evaluating or syncing.
LEAVE_TIMEOUT_S = 3600.0
# Comma list of TensorPipe channels (default: TensorPipe's choice). Hosts emulated by network
# namespaces share one kernel, where the cross-memory-attach channel would move tensors around
# the emulated network; benchmarks of a slow link set "basic" (tensors over TCP).
RPC_CHANNELS_ENV = "SHADOWSYNC_RPC_CHANNELS"


@dataclass(frozen=True)
class RpcEndpoint:
    """Where the RPC world meets: a TCP store hosted by RPC rank 0, or the launcher's agent
    (`agent_store`), under the keys of this attempt of the job (see `rendezvous`)."""

    addr: str
    port: int
    attempt: int = 0
    agent_store: bool = False

    def join(self, name: str, rank: int, world_size: int, threads: int = 8) -> None:
        warnings.filterwarnings("ignore", message=".*ProcessGroupGloo.*")
        opts = rpc.TensorPipeRpcBackendOptions(
            init_method=rendezvous.url(self.addr, self.port, self.attempt, self.agent_store),
            num_worker_threads=threads,
            rpc_timeout=RPC_TIMEOUT_S,
            _transports=["uv"],
            **({"_channels": channels.split(",")}
               if (channels := os.environ.get(RPC_CHANNELS_ENV)) else {}),
        )
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)

    @staticmethod
    def leave() -> None:
        """Graceful shutdown: a barrier over the whole RPC world, then close."""
        rpc.shutdown(graceful=True, timeout=LEAVE_TIMEOUT_S)
