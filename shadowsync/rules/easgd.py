"""Elastic averaging SGD (EASGD; Zhang, Choromanska & LeCun, "Deep learning with Elastic
Averaging SGD", NeurIPS 2015), asynchronous form. ShadowSync's S-EASGD runs it in the
background against a centre variable held on dense parameter servers.

A round moves the local replica and the centre towards each other by the elastic rate alpha:

    d = alpha * (w_i - centre);   w_i = w_i - a_r * d;   centre = centre + d

with a_r = min(1, r / R) in the trainer's r-th round (`rules.warmup`). Past the first R rounds
(a_r = 1) the sum w_i + centre is conserved by every round, and with alpha = 1/2 both end at
their midpoint. Before, the centre moves as in EASGD while the pull on the replica is warmed
up: the centre starts at the initial model, and in a job's first rounds, when the replicas
move furthest, a full pull drags them back towards it. The 2-trainer job of 108,000 examples
(4 to 6 rounds) ended at eval NE 0.81-0.82 with the full pull, where model averaging ended at
0.74-0.75.

Trainers talk to the servers, not to each other, until the job's last round, once every
trainer has finished training; that round ends at the replicas' average instead, as model
averaging and BMUF do:

    w_i = mean_i(w_i)

where a pull would leave each replica a share of the way to a centre that lags them.
"""

from __future__ import annotations

from typing import Any

import torch

from shadowsync.rules.base import Exchange
from shadowsync.rules.warmup import ramp


class ElasticAveraging:
    name = "easgd"
    needs_servers = True

    def __init__(self, alpha: float = 0.5, warmup_rounds: int = 0) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"elastic rate alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.warmup_rounds = warmup_rounds
        self.rounds = 0  # this trainer's rounds so far

    def start(self, initial: torch.Tensor) -> None:
        self.rounds = 0

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        if exchange.every_trainer_done():
            return exchange.mean(local)
        self.rounds += 1
        d = self.alpha * (local - exchange.centre())
        exchange.add_to_centre(d)
        return local - ramp(self.rounds, self.warmup_rounds) * d

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rounds": torch.tensor(self.rounds)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rounds = int(state["rounds"]) if "rounds" in state else self.warmup_rounds

    def settings(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "warmup_rounds": self.warmup_rounds}
