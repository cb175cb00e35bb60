"""Elastic averaging SGD (EASGD; Zhang, Choromanska & LeCun, "Deep learning with Elastic
Averaging SGD", NeurIPS 2015), asynchronous form. ShadowSync's S-EASGD runs it in the
background against a centre variable held on dense parameter servers.

A round moves the local replica and the centre towards each other by the elastic rate alpha:

    d = alpha * (w_i - centre);   centre = centre + d;   w_i = w_i - d   (from round R + 1)

so the sum w_i + centre is conserved by every round, and with alpha = 1/2 both end at their
midpoint. In the trainer's first R rounds (R = warmup_rounds) the centre moves the same way
but the replica stays where it is: the centre starts at the initial model, and while it
catches up with replicas that move furthest in a job's first rounds, a pull would drag them
back towards where they started. The 2-trainer job of 108,000 examples (4 to 6 rounds)
ended at eval NE 0.81-0.83 with the pull from the first round, 0.75-0.76 with a pull grown
linearly over 20 rounds, and 0.74-0.75, as model averaging, with none in the first 20.

Trainers talk to the servers, not to each other, until the job's last round, once every
trainer has finished training; that round ends at the replicas' average instead, as model
averaging and BMUF do:

    w_i = mean_i(w_i)

where a pull would leave each replica a share of the way to a centre that lags them.
"""

from __future__ import annotations

import torch

from shadowsync.rules.base import Exchange


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
        return local - d if self.rounds > self.warmup_rounds else local

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rounds": torch.tensor(self.rounds)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rounds = int(state["rounds"]) if "rounds" in state else self.warmup_rounds

    def settings(self) -> dict[str, object]:
        return {"alpha": self.alpha, "warmup_rounds": self.warmup_rounds}
