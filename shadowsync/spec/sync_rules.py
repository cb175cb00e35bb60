"""Every sync rule (what a round does to a trainer's replica), in one table.

An entry names its rule's class as "module:Class" (a `SyncRule` of `shadowsync.rules`),
imported only when a run makes the rule, so this table stays a leaf that the configuration
reads without importing torch. It also says what the rest of the code needs to know of the
rule: its words in `--sync`'s help, whether its rounds go to a centre on dense parameter
servers, the options its constructor takes, and whether the dense rate left open is raised for
it. The `--sync` modes of a rule, `s-NAME` in the background and `fr-NAME` in the foreground,
are made from its entry (`shadowsync.spec.modes`). Adding a rule is one module with its class
plus one entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# A constructor keyword that takes the job's trainers (not an option of `--sync`).
TRAINERS = "trainers"


@dataclass(frozen=True)
class RuleKind:
    name: str
    what: str  # the rule in a few words: its modes' help and row of the table of modes
    builder: str  # "module:Class" of a SyncRule
    # Constructor keyword -> the `SyncConfig` field it takes (TRAINERS: the job's trainers).
    settings: Mapping[str, str] = field(default_factory=dict)
    # Rounds move the replica and a centre variable held on dense parameter servers (so its
    # modes need dense servers, and a straggler fallback, which averages the replicas among
    # themselves while one straggles, has no rounds of it to replace).
    centre: bool = False
    # Averages Adagrad replicas without block momentum: the dense rate left open is raised
    # by sqrt(trainers) (`shadowsync.config.train.averaged_rate_factor`).
    raises_adagrad_rate: bool = False

    @property
    def help(self) -> str:
        return self.what + (" against a centre on dense servers" if self.centre else "")

    def build(self) -> Callable[..., object]:
        module, _, cls = self.builder.partition(":")
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


RULES = "shadowsync.rules"

RULE_KINDS: dict[str, RuleKind] = {k.name: k for k in [
    RuleKind("ma", "model averaging", f"{RULES}.ma:ModelAveraging", raises_adagrad_rate=True),
    RuleKind("bmuf", "blockwise model-update filtering",
             f"{RULES}.bmuf:BlockwiseModelUpdateFiltering",
             settings={TRAINERS: TRAINERS, "block_momentum": "block_momentum",
                       "block_lr": "block_lr", "nesterov": "nesterov",
                       "warmup_rounds": "warmup_rounds"}),
    RuleKind("easgd", "elastic averaging", f"{RULES}.easgd:ElasticAveraging",
             settings={"alpha": "elastic_alpha", "warmup_rounds": "warmup_rounds",
                       TRAINERS: TRAINERS},
             centre=True, raises_adagrad_rate=True),
]}


def rule_kind(name: str) -> RuleKind:
    return RULE_KINDS[name]
