"""`--sync-groups bottom=s-easgd top=s-bmuf`: a rule mode for the parameters under one of the
model's modules (the rest follow --sync). Which modules the model has is known only once it
is built (`shadowsync.runners.build.group_syncs` checks the names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shadowsync.errors import UserError
from shadowsync.spec.modes import MODES


@dataclass(frozen=True)
class GroupRule:
    module: str  # a direct child of the dense model ("bottom", "top")
    mode: str  # a rule mode (s-*, fr-*)
    text: str = field(default="", compare=False)

    @staticmethod
    def parse(text: str) -> GroupRule:
        module, sep, mode = str(text).partition("=")
        if not sep or not module:
            raise UserError(f"--sync-groups: '{text}' must be MODULE=SYNC")
        rule_modes = [m.name for m in MODES.values() if m.rule is not None]
        if mode not in rule_modes:
            raise UserError(f"--sync-groups: '{mode}' is not a rule ({', '.join(rule_modes)})")
        return GroupRule(module, mode, text)

    def __str__(self) -> str:
        return self.text or f"{self.module}={self.mode}"
