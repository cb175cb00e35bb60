"""What a switch policy is (`SwitchPolicy`): from the job's progress and the detector's
verdict, the protocol from now on (`mode`), the trainers whose pushes stay asynchronous
during BSP (`isolated`), and how long one stays so after its slowdown ends (`release`).

The policies are named in `shadowsync.spec.switch_policies.POLICIES` (one entry each); each is
made from the job's `PolicySetup` by its `build`. `PlanPolicy`: the offline plan alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, runtime_checkable
from typing import Protocol as Interface

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.detector import StragglerDetector
from shadowsync.spec.detector import DetectorConfig
from shadowsync.spec.plan import SwitchPlan


@dataclass(frozen=True)
class Progress:
    """Where the job is when a policy decides."""

    applied: int  # A: every gradient applied, ASP or BSP
    bsp_applied: int  # B: those applied under BSP
    stragglers: tuple[int, ...]  # the trainers the detector flags now
    now: float  # this process's monotonic clock, seconds


@dataclass(frozen=True)
class PolicySetup:
    """What a policy is made from: the plan, the job's budget of gradients (Q), its trainers,
    the straggler detector (None for a policy that needs none) and --switch-patience."""

    plan: SwitchPlan
    budget: int
    trainers: int
    detector: StragglerDetector | None
    patience_s: float | None

    @property
    def quota(self) -> int:
        """The job's BSP quota: the plan's BSP share of its budget."""
        return round(self.plan.share_of(Protocol.BSP) * self.budget)


@runtime_checkable
class SwitchPolicy(Interface):
    name: ClassVar[str]
    detects: ClassVar[bool]  # whether it decides on the straggler detector's verdict

    @classmethod
    def build(cls, setup: PolicySetup) -> SwitchPolicy: ...

    def mode(self, at: Progress) -> Protocol: ...

    def isolated(self, at: Progress) -> tuple[int, ...]: ...

    def release(self, cfg: DetectorConfig) -> int: ...


class Whole:
    """A policy that moves every worker together: nobody is isolated, so nobody released."""

    def isolated(self, at: Progress) -> tuple[int, ...]:
        return ()

    def release(self, cfg: DetectorConfig) -> int:
        return 0


class PlanPolicy(Whole):
    """mode(t) = the plan's phase at A(t)."""

    name = "plan"
    detects = False

    def __init__(self, plan: SwitchPlan, budget: int) -> None:
        self.plan = plan
        self.budget = budget

    @classmethod
    def build(cls, setup: PolicySetup) -> PlanPolicy:
        return cls(setup.plan, setup.budget)

    def mode(self, at: Progress) -> Protocol:
        return self.plan.mode_at(at.applied, self.budget)
