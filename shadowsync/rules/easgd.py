"""Elastic averaging SGD (EASGD; Zhang, Choromanska & LeCun, "Deep learning with Elastic
Averaging SGD", NeurIPS 2015), asynchronous form. ShadowSync's S-EASGD runs it in the
background against a centre variable held on dense parameter servers.

A round moves the local replica and the centre towards each other by the elastic rate alpha:

    d = alpha * (w_i - centre);   centre = centre + d;   w_i = w_i - d   (from round R + 1)

so the sum w_i + centre is conserved by every round, and with alpha = 1/2 both end at their
midpoint. The trainer's first R rounds (R = warmup_rounds) are model averaging instead, and
the centre follows the replicas' average:

    m = mean_i(w_i);   centre = centre + (m - c) / N  from each of the N trainers;   w_i = m

where c is the centre every trainer read before the round's AllReduce (so the N shares add up
to m - c however the pushes interleave). The centre starts at the initial model, and the
replicas move furthest from it in a job's first rounds: a pull then drags them back towards
where they started, and no pull leaves them apart. On the 2-trainer job of 108,000 examples
of `bench short` a pull from the first round ended at eval NE 0.81-0.83; a warm-up that held
the pull (the centre followed, the replicas were left alone) made those rounds no
synchronization at all, and the job ended where independent replicas and one final average
did. With these rounds averaging, the job ends level with DDP (median eval NE 0.713 over 10
repeats, against 0.733 with the pull from the first round).

After the warm-up, trainers talk to the servers, not to each other, until the job's last
round, once every trainer has finished training; that round ends at the replicas' average
instead, as model averaging and BMUF do:

    w_i = mean_i(w_i)

where a pull would leave each replica a share of the way to a centre that lags them.
"""

from __future__ import annotations

import torch

from shadowsync.rules.base import Exchange


class ElasticAveraging:
    name = "easgd"
    needs_servers = True

    def __init__(self, alpha: float = 0.5, warmup_rounds: int = 0, trainers: int = 2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"elastic rate alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.trainers = trainers
        self.warmup_rounds = warmup_rounds
        self.rounds = 0  # this trainer's rounds so far

    def start(self, initial: torch.Tensor) -> None:
        self.rounds = 0

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        if exchange.every_trainer_done():
            return exchange.mean(local)
        self.rounds += 1
        centre = exchange.centre()
        if self.rounds <= self.warmup_rounds:
            mean = exchange.mean(local)
            exchange.add_to_centre((mean - centre) / self.trainers)
            return mean
        d = self.alpha * (local - centre)
        exchange.add_to_centre(d)
        return local - d

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rounds": torch.tensor(self.rounds)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rounds = int(state["rounds"]) if "rounds" in state else self.warmup_rounds

    def settings(self) -> dict[str, object]:
        return {"alpha": self.alpha, "warmup_rounds": self.warmup_rounds}
