"""The elastic online policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364): like greedy, but rides out short slowdowns. It leaves BSP only once a straggler
has lasted `patience_s` seconds since the detector first saw it, so a blip costs no switch
(each switch back to BSP has to wait for the slowest worker), and returns to BSP as soon as
the straggler clears while the BSP quota is not done.
"""

from __future__ import annotations

DEFAULT_PATIENCE_S = 1.0


class Elastic:
    name = "elastic"

    def __init__(self, quota: int, patience_s: float = DEFAULT_PATIENCE_S) -> None:
        self.quota = quota
        self.patience_s = patience_s
        self._since: float | None = None  # when the current straggler was first seen

    def mode(self, stragglers: bool, bsp_applied: int, now: float) -> str:
        if not stragglers:
            self._since = None
        elif self._since is None:
            self._since = now
        lasting = self._since is not None and now - self._since >= self.patience_s
        if lasting or bsp_applied >= self.quota:
            return "asp"
        return "bsp"
