"""The elastic online policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364; its timing policy, the online part for transient stragglers): ride out what is
short, switch for what lasts.

    mode(t) = ASP  if a straggler has been detected without a break since s, t - s >= P,
                   or B(t) >= Q
              BSP  otherwise

with B(t) and Q as in `greedy` and P the patience (`--switch-patience`, seconds). A slowdown
the detector clears within P costs no switch at all (greedy pays two), a lasting one is left
for ASP once it has lasted P, and when the detector clears the policy returns to BSP at once
while the quota is not done, so the job still gets its BSP share. The patience trades the BSP
time lost to a real straggler in its first P seconds against the switches a false alarm would
cost.
"""

from __future__ import annotations

from shadowsync.protocols import Protocol

DEFAULT_PATIENCE_S = 1.0


class Elastic:
    name = "elastic"

    def __init__(self, quota: int, patience_s: float = DEFAULT_PATIENCE_S) -> None:
        self.quota = quota
        self.patience_s = patience_s
        self._since: float | None = None  # when the current straggler was first seen

    def mode(self, stragglers: bool, bsp_applied: int, now: float) -> Protocol:
        if not stragglers:
            self._since = None
        elif self._since is None:
            self._since = now
        lasting = self._since is not None and now - self._since >= self.patience_s
        if lasting or bsp_applied >= self.quota:
            return Protocol.ASP
        return Protocol.BSP
