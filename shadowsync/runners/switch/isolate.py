"""Isolate the straggler (beyond the paper): the plan's phases, unchanged, and while the
detector sees stragglers in a BSP phase only their pushes become asynchronous; the other
workers keep BSP among themselves.

    mode(t)     = the plan's phase at A(t)          (A: every gradient applied, ASP or BSP)
    isolated(t) = the trainers detected as stragglers at t, while mode(t) is BSP

so with `bsp:s,asp` the job runs BSP, isolating whoever straggles, until A = round(s Q) (Q:
the job's budget of gradients, b examples each: the plan's switch point in examples
trained), then ASP, whoever was isolated and whenever they were released. The phases are
counted in gradients applied, not in gradients applied under BSP as greedy's quota is: an
isolated trainer's ASP pushes spend the job's budget too, so a quota counted under BSP
could outlast the budget: one of 3 trainers isolated from 24% of the job to its end at
half pace pushes a fifth of what is left asynchronously, so BSP reaches about 85% of the
budget, short of a 90% quota, and the plan's ASP phase never comes.
What the BSP phase holds instead: its members' steps plus the isolated trainers' pushes.

An isolated trainer's gradients are applied on arrival at ASP's learning rate, with their
staleness (the updates applied since the parameters they were computed on) and a momentum
buffer of their own; the others' BSP steps are formed by trainer id from the trainers not
isolated and average n - k w gradients (k isolated trainers of w workers). Who is isolated
changes only when a BSP step is done (`machine`), so every member hears it in that step's
reply. Greedy (`greedy`) moves every worker to ASP for one slow trainer, so the fast ones'
gradients go stale too; here only the slow one's are. What it gives up: a BSP step without
the straggler averages fewer gradients (a smaller global batch at the same rate). If the
detector flags every trainer at once, isolating them all would leave no BSP step to form and
nobody to isolate them from: nobody is isolated and the job keeps BSP.

Release. The detector clears a trainer after m windows of w of its steps in a row at a
normal pace (`detector`). If its steps are normal from the one after its slowdown ends, the
window holding that step closes within w steps (slow if the slowdown held most of it), and m
normal windows follow, so it is cleared within (m + 1) w of its steps after the end:

    cleared by step  c0 + m w  if the window closing at c0 held more slow steps than normal
                     c0 + (m - 1) w  otherwise,       c0 = w ceil((e + 1) / w)

for a slowdown whose last slow step is the trainer's step e (steps counted from the first
the detector saw). It is released at the first BSP step done after that (the members' step
under way), so within (m + 1) w + 1 of its steps at the members' pace: 21 at m = 3, w = 5.
It joins the BSP step after the reply that tells it so.
"""

from __future__ import annotations

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.policy import PolicySetup, Progress
from shadowsync.spec.detector import DetectorConfig
from shadowsync.spec.plan import SwitchPlan


def release_bound(m: int, window: int) -> int:
    """The most steps of its own, at the members' pace, a trainer stays isolated after its
    slowdown ends: (m + 1) w to be cleared, one more for the members' step under way."""
    return (m + 1) * window + 1


class Isolate:
    name = "isolate"
    detects = True

    def __init__(self, plan: SwitchPlan, budget: int, trainers: int) -> None:
        self.plan = plan
        self.budget = budget  # gradients the job applies in all
        self.trainers = trainers

    @classmethod
    def build(cls, setup: PolicySetup) -> Isolate:
        return cls(setup.plan, setup.budget, setup.trainers)

    def mode(self, at: Progress) -> Protocol:
        """The plan's phase after A gradients, whoever is isolated."""
        return self.plan.mode_at(at.applied, self.budget)

    def isolated(self, at: Progress) -> tuple[int, ...]:
        """Trainers whose pushes are asynchronous while the rest run BSP."""
        if self.mode(at) is not Protocol.BSP or len(at.stragglers) >= self.trainers:
            return ()
        return tuple(sorted(at.stragglers))

    def release(self, cfg: DetectorConfig) -> int:
        return release_bound(cfg.m, cfg.window)
