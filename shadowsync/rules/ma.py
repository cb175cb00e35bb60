"""Model averaging (MA): every round replaces each replica by the mean of all replicas.

Periodic model averaging is local SGD (Stich, "Local SGD Converges Fast and Communicates
Little", ICLR 2019); run in the background it is ShadowSync's S-MA (Zheng et al., arXiv
2003.03477). Guarantee: right after a round, every trainer holds the same parameters, the
average of what they held.
"""

from __future__ import annotations

import torch

from shadowsync.rules.base import Exchange


class ModelAveraging:
    name = "ma"
    needs_servers = False

    def start(self, initial: torch.Tensor) -> None:
        pass

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        return exchange.mean(local)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}  # a round depends on nothing but the replicas

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass

    def settings(self) -> dict[str, object]:
        return {}
