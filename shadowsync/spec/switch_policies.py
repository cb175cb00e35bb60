"""Every `--switch-policy`, in one table: when Sync-Switch changes protocol.

An entry names its policy's class as "module:Class" (a `SwitchPolicy` of
`shadowsync.runners.switch.policy`), imported only when a job's schedule is made, so this
table stays a leaf the configuration reads for the option's choices and help. Adding a policy
is one module with its class plus one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

SWITCH = "shadowsync.runners.switch"


@dataclass(frozen=True)
class PolicyKind:
    name: str
    help: str
    builder: str  # "module:Class" of a SwitchPolicy

    def build(self) -> type:
        module, _, cls = self.builder.partition(":")
        return getattr(importlib.import_module(module), cls)


POLICIES: dict[str, PolicyKind] = {p.name: p for p in [
    PolicyKind("plan", "the plan's shares", f"{SWITCH}.policy:PlanPolicy"),
    PolicyKind("greedy", "ASP while a straggler lasts", f"{SWITCH}.greedy:Greedy"),
    PolicyKind("elastic", "ASP only once a straggler lasted --switch-patience s",
               f"{SWITCH}.elastic:Elastic"),
    PolicyKind("isolate", "the plan's phases, with only the stragglers' pushes ASP during BSP",
               f"{SWITCH}.isolate:Isolate"),
]}

POLICY_CHOICES = tuple(POLICIES)
DEFAULT_POLICY = "plan"
POLICY_HELP = "when to switch: " + "; ".join(f"{p.name}: {p.help}" for p in POLICIES.values())
