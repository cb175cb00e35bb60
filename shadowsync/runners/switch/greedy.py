"""The greedy online policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364; its timing policy, the online part for transient stragglers): react at once.

    mode(t) = ASP  if a straggler is detected at t  or  B(t) >= Q
              BSP  otherwise

where B(t) is the gradients applied under BSP so far and Q the job's BSP quota (the offline
plan's BSP share of its budget of gradients). So greedy leaves BSP on the detector's first
verdict, returns to BSP the moment the detector clears (to finish the quota), and runs ASP
once the quota is done. A straggler holds every BSP step back to its pace; under ASP the others
go on without it, and the job still gets the BSP share that keeps its accuracy, only moved out
of the straggler's way. Its cost: every false alarm is two switches, and each return to BSP
waits for the slowest worker.
"""

from __future__ import annotations

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.policy import PolicySetup, Progress, Whole


class Greedy(Whole):
    name = "greedy"
    detects = True

    def __init__(self, quota: int) -> None:
        self.quota = quota  # gradients to apply under BSP over the whole job

    @classmethod
    def build(cls, setup: PolicySetup) -> Greedy:
        return cls(setup.quota)

    def mode(self, at: Progress) -> Protocol:
        """The protocol to run from now on."""
        if at.stragglers or at.bsp_applied >= self.quota:
            return Protocol.ASP
        return Protocol.BSP
