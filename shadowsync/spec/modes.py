"""Every `--sync` mode, in one table.

A mode says how its runner is built, which rule it runs (for the modes that run a rule over
parameter groups), whether it needs dense parameter servers, and whether every worker of the
job steps in lockstep (then every worker must take the same number of steps, or its last step
waits forever for ranks that ran out of data).

Adding a mode is one module with a builder plus one entry here (and its row in `TABLE`, the
table of modes the README and docs/sync-modes.md show, which `scripts/mode_table.py` writes
from it). Builders are named as
"module:function" and imported only when a run needs them, so this table stays a leaf that the
configuration can read without importing torch. The modes of a sync rule (`s-NAME`,
`fr-NAME`), their entries and rows, are made from the rule's entry in
`shadowsync.spec.sync_rules.RULE_KINDS`: adding a rule adds them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from shadowsync.protocols import Protocol  # defined in the base layer (transport names it too)
from shadowsync.spec.sync_rules import RULE_KINDS

GROUPED = "shadowsync.runners.build:grouped_runner"
DDP = "shadowsync.runners.ddp:ddp_runner"
PERIODIC_AVERAGING = "shadowsync.runners.ddp:periodic_averaging_runner"
PROTOCOL = "shadowsync.runners.protocol:protocol_runner"


Family = Literal["background", "foreground"]


@dataclass(frozen=True)
class SyncMode:
    name: str
    help: str
    builder: str | None  # "module:function" taking a RunnerContext; None: no runner
    rule: str | None = None  # the rule of a rule-over-groups mode (--sync-groups accepts these)
    family: Family | None = None  # rule modes of one family share a runner
    dense_servers: bool = False
    lockstep: bool = False
    # Whether a run can stop early and resume from its workers' positions (every mode now;
    # a mode whose workers could not agree on the step they stop at would say False).
    resumable: bool = True
    # The parameter-server protocols its workers push under (empty: no per-step pushes, so
    # no push can be delayed by a delay or jitter straggler).
    protocols: tuple[Protocol, ...] = ()
    can_switch: bool = False  # --switch-plan / --switch-policy move it between protocols
    can_fall_back: bool = False  # --straggler-fallback may replace its rounds while one straggles

    @property
    def synchronizes(self) -> bool:
        """Whether the mode runs anything between trainers (`none`: independent trainers)."""
        return self.builder is not None

    @property
    def stops_alone(self) -> bool:
        """Whether each worker may stop after its own current step: not under a per-step
        protocol, whose dense servers decide when every worker stops."""
        return self.resumable and not self.protocols

    def build(self) -> Callable[..., object] | None:
        if self.builder is None:
            return None
        module, _, fn = self.builder.partition(":")
        return getattr(importlib.import_module(module), fn)


class ModeName(str):
    """A --sync value: the name of a mode of `MODES`, read into this type once when the
    configuration is made (which checks it is one of them). It stays the text it is wherever a
    mode is written or compared; `mode_of` gives its entry."""

    @classmethod
    def parse(cls, text: str) -> ModeName:
        return cls(text)

    @property
    def text(self) -> str:
        return str(self)


# The families a rule runs in: (prefix of its modes' names, when their rounds run, the same
# in the table of modes).
FAMILIES: dict[Family, tuple[str, str, str]] = {
    "background": ("s-", "in a background thread (ShadowSync)",
                   "in a background thread that never stops the workers (ShadowSync)"),
    "foreground": ("fr-", "every --sync-every steps, workers waiting",
                   "in the foreground, every `--sync-every` steps, workers waiting"),
}


def rule_modes(family: Family) -> list[SyncMode]:
    """A mode for each rule of `RULE_KINDS` in `family`, made from the rule's entry."""
    prefix, when, _ = FAMILIES[family]
    return [SyncMode(f"{prefix}{r.name}", f"{r.help}, {when}", GROUPED, rule=r.name,
                     family=family, dense_servers=r.centre,
                     can_fall_back=family == "background" and not r.centre)
            for r in RULE_KINDS.values()]


def rule_rows() -> list[TableRow]:
    """A row of the table of modes for each family: every rule's modes in it."""
    rows = []
    for prefix, _, when in FAMILIES.values():
        what = ", ".join(r.what for r in RULE_KINDS.values())
        if rows:  # said in the row before
            what = "the same rules"
        rows.append(TableRow(tuple(f"{prefix}{r}" for r in RULE_KINDS), what, when))
    return rows


MODES: dict[str, SyncMode] = {m.name: m for m in [
    SyncMode("none", "independent trainers", None),
    *rule_modes("background"),
    *rule_modes("foreground"),
    SyncMode("ddp", "PyTorch DistributedDataParallel", DDP, lockstep=True),
    SyncMode("torch-fr-ma", "PyTorch post-local SGD", PERIODIC_AVERAGING, lockstep=True),
    SyncMode("torchft-ma", "torchft LocalSGD, every --sync-every steps (optional peers extra)",
             "shadowsync.runners.torchft_ma:torchft_runner", lockstep=True),
    SyncMode("bsp", "bulk-synchronous steps on dense parameter servers", PROTOCOL,
             dense_servers=True, lockstep=True, protocols=(Protocol.BSP,)),
    SyncMode("asp", "asynchronous steps on dense parameter servers", PROTOCOL,
             dense_servers=True, protocols=(Protocol.ASP,)),
    SyncMode("switch", "Sync-Switch: BSP and ASP in turn (--switch-plan, --switch-policy)",
             PROTOCOL, dense_servers=True, lockstep=True,
             protocols=(Protocol.BSP, Protocol.ASP), can_switch=True),
]}

SYNC_CHOICES = tuple(MODES)
DEFAULT_MODE = "s-bmuf"  # --sync's default (`config.sections.SyncConfig.mode`)


@dataclass(frozen=True)
class TableRow:
    """One row of the table of modes users read: modes that run alike, what and when."""

    modes: tuple[str, ...]
    what: str
    when: str


TABLE: tuple[TableRow, ...] = (
    *rule_rows(),
    TableRow(("ddp",), "PyTorch DistributedDataParallel (gradient AllReduce)",
             "inside every step"),
    TableRow(("torch-fr-ma",), "PyTorch's post-local SGD (`PeriodicModelAverager`)",
             "every `--sync-every` steps"),
    TableRow(("torchft-ma",), "torchft's LocalSGD (optional `peers` extra)",
             "every `--sync-every` steps"),
    TableRow(("bsp", "asp"), "bulk-synchronous / asynchronous SGD on dense parameter servers",
             "every step"),
    TableRow(("switch",), "BSP, then ASP (or any `--switch-plan`), switched in place",
             "every step"),
    TableRow(("none",), "nothing: independent trainers", "never"),
)


def mode_table() -> str:
    """`TABLE` as Markdown: every mode in one row, the default marked."""
    lines = ["| `--sync` | what runs | when |", "|---|---|---|"]
    for row in TABLE:
        names = ", ".join(f"`{m}`" + (" (default)" if m == DEFAULT_MODE else "")
                          for m in row.modes)
        lines.append(f"| {names} | {row.what} | {row.when} |")
    return "\n".join(lines)


__all__ = ["DEFAULT_MODE", "MODES", "SYNC_CHOICES", "TABLE", "Protocol", "SyncMode",
           "TableRow", "mode_of", "mode_table"]


def mode_of(name: str) -> SyncMode:
    return MODES[name]
