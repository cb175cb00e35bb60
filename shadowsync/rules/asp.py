"""Asynchronous parallel (ASP) on a parameter server, as in Sync-Switch (Li, Mangoubi, Xu,
Guo, ICDCS 2021, arXiv 2104.08364).

Each gradient is applied the moment it arrives; nobody waits for anybody. A gradient computed
on parameters of version v and applied when the server is at version V has staleness V - v
(0 when no other update came in between). With lr scaled to L / n, n gradients applied in turn
move the parameters exactly as BSP's one step at L does when the gradients are the same
(linear scaling; without momentum).
"""

from __future__ import annotations

from shadowsync.protocols import Protocol


class Asynchronous:
    name = Protocol.ASP

    @staticmethod
    def staleness(server_version: int, grad_version: int) -> int:
        return server_version - grad_version
