"""From a run configuration to the runner a trainer uses.

`--sync` names a runner and a rule together (s-bmuf: background BMUF; fr-ma: foreground
model averaging); `--sync-groups` gives other rules to parts of the model. All groups share one
runner, since a trainer has one sync thread.
"""

from __future__ import annotations

from typing import Any

import torch

from shadowsync.config import TrainConfig
from shadowsync.errors import UserError
from shadowsync.rules import make_rule
from shadowsync.runners.base import SyncRunner
from shadowsync.runners.groups import ParamGroup, split_model

RUNNER_OF_PREFIX = {"s-": "background", "fr-": "foreground"}


def parse_sync(name: str) -> tuple[str, str | None]:
    """'s-bmuf' -> ('background', 'bmuf'); 'none' -> ('none', None)."""
    for prefix, runner in RUNNER_OF_PREFIX.items():
        if name.startswith(prefix):
            return runner, name[len(prefix):]
    return name, None


def group_syncs(cfg: TrainConfig, model: torch.nn.Module) -> dict[str, str]:
    """Module prefix -> sync name, validated against the model's modules."""
    modules = {n for n, _ in model.named_children()}
    out: dict[str, str] = {}
    for entry in cfg.sync_groups:
        prefix, sep, sync = entry.partition("=")
        if not sep or prefix not in modules:
            raise UserError(f"--sync-groups: '{entry}' must be MODULE=SYNC with MODULE one of "
                            f"{', '.join(sorted(modules))}")
        if parse_sync(sync)[1] is None:
            raise UserError(f"--sync-groups: '{sync}' is not a rule (s-ma, s-bmuf, s-easgd, "
                            "fr-ma, fr-bmuf, fr-easgd)")
        out[prefix] = sync
    kinds = {parse_sync(s)[0] for s in [*out.values(), cfg.sync]
             if parse_sync(s)[1] is not None}
    if len(kinds) > 1:
        raise UserError("--sync-groups: all groups must be background (s-*) or all foreground "
                        "(fr-*) in one run")
    if out and parse_sync(cfg.sync)[1] is None and cfg.sync != "none":
        raise UserError(f"--sync-groups cannot be combined with --sync {cfg.sync}")
    return out


def needs_dense_servers(cfg: TrainConfig, model: torch.nn.Module) -> bool:
    names = [cfg.sync, *group_syncs(cfg, model).values()]
    return any(parse_sync(n)[1] == "easgd" for n in names)


def rule_for(cfg: TrainConfig, rule: str) -> Any:
    if rule == "bmuf":
        return make_rule("bmuf", trainers=cfg.trainers, block_momentum=cfg.block_momentum,
                         block_lr=cfg.block_lr, nesterov=cfg.nesterov)
    if rule == "easgd":
        return make_rule("easgd", alpha=cfg.elastic_alpha)
    return make_rule(rule)


def param_groups(cfg: TrainConfig, model: torch.nn.Module) -> tuple[str | None, list[ParamGroup]]:
    """The runner kind and the synchronized groups (params under `none` are left alone)."""
    per_prefix = group_syncs(cfg, model)
    groups: list[ParamGroup] = []
    kind = None
    for key, params in split_model(model, {p: p for p in per_prefix}).items():
        runner, rule = parse_sync(per_prefix.get(key, cfg.sync))
        if rule is None:
            continue
        kind = runner
        name = key if key != "*" else ("rest" if per_prefix else "dense")
        groups.append(ParamGroup(name, params, rule_for(cfg, rule), cfg.write_back))
    return kind, groups


def build_runner(cfg: TrainConfig, kind: str | None, groups: list[ParamGroup],
                 exchange: Any, trainer_cores: float) -> SyncRunner | None:
    """`trainer_cores`: this trainer's share of its host's cores, which the auto pace budgets."""
    from shadowsync.runners.foreground import ForegroundSync
    from shadowsync.runners.shadow import BackgroundSync, Pace

    if kind == "background":
        return BackgroundSync(groups, exchange,
                              Pace(cfg.sync_interval_s(), cfg.sync_budget, trainer_cores))
    if kind == "foreground":
        return ForegroundSync(groups, exchange, cfg.sync_every)
    return None
