"""Background synchronization that steps aside for a straggler (`--straggler-fallback
s-easgd` with `--sync s-ma` or `s-bmuf`): the rounds of the job's rule, except while the
straggler detector sees a slow trainer, when they are S-EASGD rounds against a centre on the
dense servers (`switch.background` decides; the same policy engine as Sync-Switch's).

Every round starts by sharing each trainer's new step-time means (one small AllReduce), so
every trainer runs the same detector on the same numbers and picks the same rule for the
round. A round that moves averages the models (MA): moving to EASGD, the
average seeds the centre; moving back, the job's rule starts over from it (BMUF's global
model and block momentum would otherwise still describe the model from before the move).
"""

from __future__ import annotations

import logging
import time

import torch

from shadowsync.config import SyncConfig
from shadowsync.rules import SyncRule, make_rule
from shadowsync.rules.base import Exchange
from shadowsync.rules.ma import ModelAveraging
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.reports import WorkerReport
from shadowsync.runners.shadow import BackgroundSync, Pace
from shadowsync.runners.switch.background import BackgroundFallback
from shadowsync.spec.detector import DetectorConfig
from shadowsync.spec.modes import mode_of
from shadowsync.transport.collectives import TrainerExchange

log = logging.getLogger(__name__)
SLOTS = 16  # step-time means a trainer shares per round at most (the rest wait a round)


class FallbackSync(BackgroundSync):
    kind = "background"

    def __init__(self, groups: list[ParamGroup], exchange: TrainerExchange, pace: Pace,
                 fallback: dict[str, SyncRule], policy: BackgroundFallback,
                 names: tuple[str, str]) -> None:
        super().__init__(groups, exchange, pace)
        self.primary = {g.name: g.rule for g in groups}
        self.fallback = fallback
        self.policy = policy
        self.names = names  # (the job's --sync, the fallback's) for logs
        self.moves: list[dict[str, object]] = []
        self._steps: list[float] = []

    def observe(self, report: WorkerReport) -> None:
        self._steps.extend(report.step_s)

    def start(self) -> None:
        for g in self.groups:  # the centre exists from the start, as the initial model
            self.exchange.init_centre(g.name, g.flat())
        super().start()

    def run_round(self, done: bool) -> tuple[bool, float, float]:
        mine, self._steps = self.policy.chunks(self._steps, SLOTS)
        flat = self.exchange.gather(mine)
        paces = [flat[i:i + SLOTS] for i in range(0, len(flat), SLOTS)]
        was = self.policy.rule
        rule = self.policy.decide(paces)  # never on local state: every trainer agrees
        if rule == was:
            return super().run_round(done)
        averages = {g.name: _Averaging() for g in self.groups}
        for g in self.groups:
            g.rule = averages[g.name]
        out = super().run_round(done)
        for g in self.groups:
            mean = averages[g.name].mean
            if rule == self.policy.fallback:
                self.exchange.init_centre(g.name, mean)
                g.rule = self.fallback[g.name]
            else:
                g.rule = self.primary[g.name]
                g.rule.start(mean)
        self._record(was, rule, paces)
        return out

    def _record(self, was: str, rule: str, paces: list[list[float]]) -> None:
        name = {self.policy.primary: self.names[0], self.policy.fallback: self.names[1]}
        move = {"from": name[was], "to": name[rule], "round": self.all_rounds,
                "wall_time": time.time(), "stragglers": self.policy.stragglers,
                "paces_s": [[round(p, 5) for p in t if p > 0] for t in paces]}
        self.moves.append(move)
        if self.exchange.index == 0:
            log.info("background sync: %s -> %s at round %d, stragglers %s", move["from"],
                     move["to"], move["round"], move["stragglers"] or "none (cleared)")

    def state_dict(self) -> dict[str, object]:
        """The job's rule's state, also while EASGD rounds run (a resumed job starts on the
        job's rule, so a checkpoint always has what that rule loads)."""
        if self._thread is None and not self.all_rounds:  # before start: shapes, as base
            return super().state_dict()
        return {f"{name}.{k}": v for name, rule in self.primary.items()
                for k, v in rule.state_dict().items()}

    def final_metrics(self) -> dict[str, object]:
        return {**super().final_metrics(), "sync_moves": self.moves}

    def summarize(self, everyone: list[dict[str, object]]) -> dict[str, object]:
        return {"sync_moves": everyone[0].get("sync_moves", []) if everyone else []}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "straggler_fallback": self.names[1]}


class _Averaging(ModelAveraging):
    """MA that keeps the average it computed."""

    mean: torch.Tensor | None = None

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        self.mean = exchange.mean(local)
        return self.mean


def fallback_runner(sync: SyncConfig, detector: DetectorConfig, groups: list[ParamGroup],
                    exchange: TrainerExchange, pace: Pace) -> FallbackSync:
    fallback = sync.straggler_fallback
    assert fallback is not None, "built only with --straggler-fallback"
    rule = mode_of(fallback).rule
    primary = sync.entry.rule
    assert rule is not None and primary is not None, "validated by the configuration"
    policy = BackgroundFallback(primary, detector, fallback=rule)
    rules: dict[str, SyncRule] = {g.name: make_rule(rule, alpha=sync.elastic_alpha)
                                  for g in groups}
    return FallbackSync(groups, exchange, pace, rules, policy, (sync.mode, fallback))
