"""Blockwise model-update filtering (BMUF; Chen & Huo, "Scalable training of deep learning
machines by incremental block training with intra-block parallel optimization and blockwise
model-update filtering", ICASSP 2016). ShadowSync's S-BMUF runs it in the background.

Each trainer keeps the global model w_g and the block momentum delta. A round computes

    start  = w_g            or  w_g + eta * delta  with Nesterov look-ahead
    G      = mean_i(w_i) - start          (the block's aggregated update)
    delta  = eta * delta + zeta * G       (filtered by block momentum eta, block lr zeta)
    w_g    = w_g + delta
    local  = w_g            or  w_g + eta * delta  with Nesterov look-ahead

where `start` is the point the block's local models started from, the previous round's
`local`. With the look-ahead, G is measured from there, as Nesterov's gradient is taken at
the look-ahead point and applied to w_g; measured from w_g it would count eta * delta once
more every round, a block momentum of 2 * eta that grows without bound from eta = 0.5.

Every trainer applies the same arithmetic to the same mean, so w_g and delta stay identical
on all trainers without being communicated. With eta = 0 and zeta = 1 BMUF is exactly model
averaging. The defaults follow the paper: eta = 1 - 1/trainers, zeta = 1.
"""

from __future__ import annotations

from typing import Any

import torch

from shadowsync.rules.base import Exchange


class BlockwiseModelUpdateFiltering:
    name = "bmuf"
    needs_servers = False

    def __init__(self, trainers: int = 2, block_momentum: float | None = None,
                 block_lr: float = 1.0, nesterov: bool = False) -> None:
        self.eta = 1.0 - 1.0 / trainers if block_momentum is None else block_momentum
        self.zeta = block_lr
        self.nesterov = nesterov
        self.global_model: torch.Tensor | None = None
        self.delta: torch.Tensor | None = None

    def start(self, initial: torch.Tensor) -> None:
        self.global_model = initial.detach().clone()
        self.delta = torch.zeros_like(self.global_model)

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        if self.global_model is None or self.delta is None:
            raise RuntimeError("BMUF.round called before start()")
        block_update = exchange.mean(local) - self._start_point()
        self.delta.mul_(self.eta).add_(block_update, alpha=self.zeta)
        self.global_model.add_(self.delta)
        nxt = self._start_point()
        return nxt if self.nesterov else nxt.clone()  # never hand out w_g itself

    def _start_point(self) -> torch.Tensor:
        """Where the next block starts: w_g itself (no copy), or its look-ahead."""
        assert self.global_model is not None and self.delta is not None
        if self.nesterov:
            return self.global_model + self.eta * self.delta
        return self.global_model

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The global model and the block momentum (identical on every trainer)."""
        if self.global_model is None or self.delta is None:
            raise RuntimeError("BMUF state asked for before start()")
        return {"global_model": self.global_model, "block_momentum": self.delta}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.global_model = state["global_model"].clone()
        self.delta = state["block_momentum"].clone()

    def settings(self) -> dict[str, Any]:
        return {"block_momentum": self.eta, "block_lr": self.zeta, "nesterov": self.nesterov}
