"""From a run configuration to the runner a trainer uses.

`--sync` names a mode in `shadowsync.spec.modes`; the mode's builder makes the runner from a
`RunnerContext`. Rule modes (s-*, fr-*) also accept `--sync-groups`, other rules for parts of
the model; all groups share one runner, since a trainer has one sync thread.
"""

from __future__ import annotations

import torch

from shadowsync.config import SyncConfig
from shadowsync.errors import UserError
from shadowsync.rules import SyncRule, make_rule
from shadowsync.runners.base import Runner, RunnerContext
from shadowsync.runners.fallback import fallback_runner
from shadowsync.runners.foreground import ForegroundSync
from shadowsync.runners.groups import ParamGroup, split_model
from shadowsync.runners.shadow import BackgroundSync, Pace
from shadowsync.spec.modes import mode_of
from shadowsync.spec.sync_rules import TRAINERS, rule_kind
from shadowsync.transport.collectives import TrainerExchange
from shadowsync.transport.servers.dense import DenseServerClient


def group_syncs(sync: SyncConfig, model: torch.nn.Module) -> dict[str, str]:
    """Module prefix -> sync name (`--sync-groups`, parsed and checked against the modes by
    the configuration), each module checked to be one of the model's."""
    modules = {n for n, _ in model.named_children()}
    for group in sync.groups:
        if group.module not in modules:
            raise UserError(f"--sync-groups: '{group}' must be MODULE=SYNC with MODULE one of "
                            f"{', '.join(sorted(modules))}")
    return {group.module: group.mode for group in sync.groups}


def needs_dense_servers(sync: SyncConfig, model: torch.nn.Module) -> bool:
    names = [sync.mode, *group_syncs(sync, model).values()]
    if sync.straggler_fallback is not None:
        names.append(sync.straggler_fallback)
    return any(mode_of(n).dense_servers for n in names)


def rule_for(sync: SyncConfig, trainers: int, rule: str) -> SyncRule:
    """The rule with the settings its entry names (`RuleKind.settings`), read off `sync`."""
    settings = {keyword: trainers if option == TRAINERS else getattr(sync, option)
                for keyword, option in rule_kind(rule).settings.items()}
    return make_rule(rule, **settings)


def param_groups(sync: SyncConfig, trainers: int,
                 model: torch.nn.Module) -> tuple[str | None, list[ParamGroup]]:
    """The runner family and the synchronized groups (params under `none` are left alone)."""
    per_prefix = group_syncs(sync, model)
    groups: list[ParamGroup] = []
    family = None
    for key, params in split_model(model, {p: p for p in per_prefix}).items():
        mode = mode_of(per_prefix.get(key, sync.mode))
        if mode.rule is None:
            continue
        family = mode.family
        name = key if key != "*" else ("rest" if per_prefix else "dense")
        groups.append(ParamGroup(name, params, rule_for(sync, trainers, mode.rule),
                                 sync.write_back))
    return family, groups


def build_runner(ctx: RunnerContext) -> Runner | None:
    """The runner of this trainer, or None when nothing synchronizes."""
    build = ctx.sync.entry.build()
    if build is None and ctx.sync.groups:
        build = grouped_runner  # --sync none with rules for some groups
    return build(ctx) if build is not None else None


def grouped_runner(ctx: RunnerContext) -> Runner | None:
    """A background or foreground runner over the rule groups of `--sync` / `--sync-groups`."""
    family, groups = param_groups(ctx.sync, ctx.cluster.trainers, ctx.model)
    centres = {g.name: DenseServerClient(f"centre/{g.name}", ctx.cluster.dense_servers or 0)
               for g in groups if g.rule.needs_servers or ctx.sync.straggler_fallback}
    exchange = TrainerExchange(ctx.trainer_group, ctx.cluster.trainers, centres,
                               dtype=ctx.sync.dtype,
                               transport=ctx.sync.transport)
    if family == "background":
        pace = Pace(ctx.sync.interval, ctx.sync.budget, ctx.trainer_cores)
        if ctx.sync.straggler_fallback is not None:
            return fallback_runner(ctx.sync, ctx.switch.detector, groups, exchange, pace)
        return BackgroundSync(groups, exchange, pace)
    if family == "foreground":
        return ForegroundSync(groups, exchange, ctx.sync.every)
    return None
