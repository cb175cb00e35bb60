"""Which protocol the job runs next: the one place that decides, on the dense server that
holds shard 0 of the parameters (it sees every gradient, so it sees every trainer's pace;
each trainer's runner sees only its own workers).

- `plan` (offline): the phases of `--switch-plan`, from the gradients applied so far;
- `greedy` / `elastic` (online): the straggler detector (`detector`) and the policy
  (`greedy`, `elastic`), with the plan's BSP share as the job's BSP quota;
- `isolate` (online, beyond the paper): the plan's phases from the gradients applied so far,
  with the detected stragglers' pushes asynchronous during BSP (`isolated`, `isolate`).

The state machine (`machine`) asks `decide` only between steps (never while a BSP step is
half collected), and replies carry the decision, so every worker changes protocol on the same
step. Both travel to the server by pickle and are driven there; they import nothing from it.
"""

from __future__ import annotations

import time
from typing import Any

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.detector import DetectorConfig, StragglerDetector
from shadowsync.runners.switch.policy import PolicySetup, Progress, SwitchPolicy
from shadowsync.spec.plan import SwitchPlan
from shadowsync.spec.switch_policies import DEFAULT_POLICY, POLICIES
from shadowsync.state_dicts import nest, part


class Schedule:
    def __init__(self, plan: SwitchPlan, budget: int, policy: str = DEFAULT_POLICY,
                 detector: DetectorConfig | None = None,
                 patience_s: float | None = None, trainers: int = 1) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown switch policy {policy!r}")
        self.plan = plan
        self.budget = budget
        self.policy_name = policy
        kind = POLICIES[policy].build()
        self.detector = StragglerDetector(detector) if kind.detects else None
        self.policy: SwitchPolicy = kind.build(
            PolicySetup(plan, budget, trainers, self.detector, patience_s))
        self.isolated: tuple[int, ...] = ()  # trainers asynchronous for now

    def first_mode(self) -> Protocol:
        return self.decide(0, 0)

    def observe(self, trainer: int, step_s: float) -> None:
        """One step's time of one of `trainer`'s workers (its compute and what a slow link
        adds, as the server sees them)."""
        if self.detector is not None:
            self.detector.observe(trainer, step_s)

    @property
    def stragglers(self) -> list[int]:
        return self.detector.stragglers if self.detector is not None else []

    # -- checkpoints: the detector's windows (the progress the policies count is the server's
    # applied and bsp_applied; an elastic policy's patience restarts with the run, its clock
    # being this process's) --
    def state_dict(self) -> dict[str, Any]:
        if self.detector is None:
            return {}
        return nest("detector.", self.detector.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.detector is not None:
            self.detector.load_state_dict(part(state, "detector."))

    def decide(self, applied: int, bsp_applied: int, now: float | None = None) -> Protocol:
        """The protocol from now on, after `applied` gradients (`bsp_applied` under BSP)."""
        at = Progress(applied, bsp_applied, tuple(self.stragglers),
                      time.monotonic() if now is None else now)
        self.isolated = self.policy.isolated(at)
        return self.policy.mode(at)
