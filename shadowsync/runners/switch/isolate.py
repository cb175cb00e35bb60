"""Isolate the straggler (beyond the paper): while the detector sees stragglers, only their
pushes become asynchronous; the other workers keep BSP among themselves.

    mode(t)     = BSP while B(t) < Q, then ASP            (Q: the job's BSP quota)
    isolated(t) = the trainers detected as stragglers at t, while mode is BSP

An isolated trainer's gradients are applied on arrival at ASP's learning rate, with their
staleness (the updates applied since the parameters they were computed on) and a momentum
buffer of their own; the others' BSP steps are formed by trainer id from the trainers not
isolated and average n - k w gradients (k isolated trainers of w workers). Who is isolated
changes only when a BSP step is done (`machine`), so every member hears it in that step's
reply. When the detector clears a trainer, it joins the next BSP step again. Greedy
(`greedy`) moves every worker to ASP for one slow trainer, so the fast ones' gradients go
stale too; here only the slow one's are, and the BSP quota is still counted in gradients
applied under BSP. What it gives up: a BSP step without the straggler averages fewer
gradients (a smaller global batch at the same rate). If the detector flags every trainer at
once, isolating them all would leave no BSP step to form and nobody to isolate them from:
nobody is isolated and the job keeps BSP (the quota is still spent under BSP; greedy would
leave BSP here).
"""

from __future__ import annotations

from collections.abc import Sequence

from shadowsync.protocols import Protocol


class Isolate:
    name = "isolate"

    def __init__(self, quota: int, trainers: int) -> None:
        self.quota = quota
        self.trainers = trainers

    def mode(self, stragglers: bool, bsp_applied: int, now: float) -> Protocol:
        return Protocol.BSP if bsp_applied < self.quota else Protocol.ASP

    def isolated(self, stragglers: Sequence[int], bsp_applied: int) -> tuple[int, ...]:
        """Trainers whose pushes are asynchronous while the rest run BSP."""
        if bsp_applied >= self.quota or len(stragglers) >= self.trainers:
            return ()
        return tuple(sorted(stragglers))
