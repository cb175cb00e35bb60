"""Elastic averaging SGD (EASGD; Zhang, Choromanska & LeCun, "Deep learning with Elastic
Averaging SGD", NeurIPS 2015), asynchronous form. ShadowSync's S-EASGD runs it in the
background against a centre variable held on dense parameter servers.

A round moves the local replica and the centre towards each other by the elastic rate alpha:

    d = alpha * (w_i - centre);   w_i = w_i - d;   centre = centre + d

so the sum w_i + centre is conserved by every round, and with alpha = 1/2 both end at their
midpoint. Trainers never talk to each other, only to the servers.
"""

from __future__ import annotations

from typing import Any

import torch

from shadowsync.rules.base import Exchange


class ElasticAveraging:
    name = "easgd"
    needs_servers = True

    def __init__(self, alpha: float = 0.5) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"elastic rate alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha

    def start(self, initial: torch.Tensor) -> None:
        pass

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        d = self.alpha * (local - exchange.centre())
        exchange.add_to_centre(d)
        return local - d

    def settings(self) -> dict[str, Any]:
        return {"alpha": self.alpha}
