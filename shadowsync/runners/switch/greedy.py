"""The greedy online policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364): ASP while any straggler lasts, BSP otherwise until the job's BSP quota (the
offline plan's BSP share of the budget) is done, then ASP for the rest.

A straggler holds every BSP step back to its pace; under ASP the others go on without it. The
BSP quota is counted in gradients applied under BSP, so the job still gets the BSP share that
keeps its accuracy, only moved out of the straggler's way.
"""

from __future__ import annotations


class Greedy:
    name = "greedy"

    def __init__(self, quota: int) -> None:
        self.quota = quota  # gradients to apply under BSP over the whole job

    def mode(self, stragglers: bool, bsp_applied: int, now: float) -> str:
        """The protocol to run from now on. `stragglers`: the detector sees one now."""
        if stragglers or bsp_applied >= self.quota:
            return "asp"
        return "bsp"
