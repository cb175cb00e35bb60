"""Protocol order: which protocol each step of a run uses (`--switch-plan`).

A plan is a sequence of phases, "bsp:0.1,asp" = BSP for the first 10% of the job's gradients,
then ASP. Sync-Switch found BSP first, then ASP, 1.2 to 2.9 accuracy points better than the
reverse (Li et al., ICDCS 2021, arXiv 2104.08364, protocol policy); any order is accepted.
Phases are fractions of the job's budget of gradients, counted on the dense servers, where
`schedule` turns the plan into each step's protocol; the online policies take the plan's BSP
share as their BSP quota.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from shadowsync.errors import UserError
from shadowsync.protocols import Protocol
from shadowsync.spec.share import parse_share

PROTOCOLS = tuple(p.value for p in Protocol)


@dataclass(frozen=True)
class Phase:
    mode: Protocol
    share: float  # of each worker's steps


@dataclass(frozen=True)
class SwitchPlan:
    phases: tuple[Phase, ...]
    text: str = field(default="", compare=False)  # as written; "" for a plan made in code

    @staticmethod
    def parse(text: str, option: str = "--switch-plan") -> SwitchPlan:
        """'bsp:0.1,asp' -> BSP 10%, ASP the rest. The last phase may omit its share."""
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise UserError(f"{option}: empty plan; expected e.g. 'bsp:0.1,asp'")
        phases: list[Phase] = []
        for i, item in enumerate(items):
            mode, sep, share_text = item.partition(":")
            mode = mode.strip()
            if mode not in PROTOCOLS:
                raise UserError(f"{option}: '{mode}' is not a protocol ({', '.join(PROTOCOLS)})")
            if not sep:
                if i != len(items) - 1:
                    raise UserError(f"{option}: only the last phase may omit its share, "
                                    f"'{item}' does not")
                share = 1.0 - sum(p.share for p in phases)
            else:
                share = parse_share(share_text)
                if share is None:
                    raise UserError(f"{option}: share in '{item}' must be in (0, 1]")
            phases.append(Phase(Protocol(mode), share))
        total = sum(p.share for p in phases)
        if abs(total - 1.0) > 1e-9 or phases[-1].share <= 1e-12:
            raise UserError(f"{option}: shares must add up to 1 (got {total:g}); leave the last "
                            "share out to give it the rest")
        return SwitchPlan(tuple(phases), text)

    @staticmethod
    def single(mode: Protocol) -> SwitchPlan:
        return SwitchPlan((Phase(Protocol(mode), 1.0),))

    def boundaries(self, total_steps: int) -> list[int]:
        """First step of each phase after the first."""
        out, acc = [], 0.0
        for p in self.phases[:-1]:
            acc += p.share
            out.append(round(acc * total_steps))
        return out

    def phase_at(self, step: int, total_steps: int) -> int:
        """Index of the phase that step `step` (0-based) of `total_steps` belongs to."""
        return bisect_right(self.boundaries(total_steps), step)

    def mode_at(self, step: int, total_steps: int) -> Protocol:
        """The protocol of step `step` (0-based) of `total_steps`."""
        return self.phases[self.phase_at(step, total_steps)].mode

    def share_of(self, mode: Protocol) -> float:
        return sum(p.share for p in self.phases if p.mode == mode)

    def with_bsp_share(self, share: float) -> SwitchPlan:
        """BSP for `share` of the job, then ASP (this plan's order kept if it starts with
        ASP)."""
        if share >= 1.0:
            return SwitchPlan.single(Protocol.BSP)
        bsp, asp = Protocol.BSP, Protocol.ASP
        first, second = (asp, bsp) if self.phases[0].mode == asp else (bsp, asp)
        a = share if first == bsp else 1.0 - share
        return SwitchPlan((Phase(first, a), Phase(second, 1.0 - a)))

    def __str__(self) -> str:
        return self.text or ",".join(f"{p.mode.value}:{p.share:g}" for p in self.phases)
