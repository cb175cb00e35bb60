"""What a trainer and its workers ask of their embedding tables, wherever the rows live:
`EmbeddingTables` in the trainer's shared memory (no embedding servers), or
`transport.servers.embedding.client.RemoteEmbeddings` (rows on the embedding servers, through
shared memory for servers on the host and RPC for the others)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from shadowsync.data.bags import Bags
from shadowsync.state_dicts import Checkpointable


@runtime_checkable
class EmbeddingClient(Protocol):
    def attach(self, name: str) -> None:
        """In a process about to train, under its name in the job (remote clients connect)."""

    def detach(self) -> None:
        """When the process is done (remote clients wait for their pushes, then leave)."""

    def lookup(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        """ids [B, tables] or `Bags` -> vectors [B, tables, dim]."""

    def apply_gradients(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                        lr_scale: float = 1.0) -> None:
        """d(loss)/d(vectors) applied to the rows `ids` point at (remote: asynchronously)."""

    def update_and_lookup(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                          next_ids: torch.Tensor | Bags | None,
                          lr_scale: float = 1.0) -> torch.Tensor | None:
        """One step's gradients applied, then the next step's vectors read (if any)."""

    def flush(self) -> None:
        """Every gradient this process pushed applied (remote: the pushes in flight
        answered), so its position is exact."""

    def counters(self) -> dict[str, int] | None:
        """Dynamic tables: their id maps' counters (lookups, hits, admitted, evicted...),
        read by the trainer when it closes; None for fixed tables."""

    def saved_here(self) -> Checkpointable | None:
        """What of the tables the trainer's own checkpoint shard holds: tables in its memory,
        or None where servers save the rows."""
