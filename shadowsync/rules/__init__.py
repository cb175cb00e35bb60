"""What a synchronization does to tensors: small, pure update rules.

A rule sees one trainer's flattened parameters and an `Exchange` (how it reaches the other
trainers or the parameter servers), and returns the new value of the local parameters. It
knows nothing of threads, processes or timing; the runners in `shadowsync.runners` decide when
a rule runs, and `shadowsync.transport` how its bytes move.

Adding an algorithm is one new module plus one entry in
`shadowsync.spec.sync_rules.RULE_KINDS` (its name, its class, the options it takes; its
`--sync` modes follow). The parameter-server protocols of Sync-Switch (`bsp`, `asp`, with
`server_update`) act on a server's state instead of a trainer's replica, so they are not
rules of that table.
"""

from __future__ import annotations

from shadowsync.rules.asp import Asynchronous
from shadowsync.rules.base import Exchange, SyncRule
from shadowsync.rules.bsp import BulkSynchronous
from shadowsync.spec.sync_rules import rule_kind


def make_rule(name: str, **settings: object) -> SyncRule:
    """The rule `name` of `RULE_KINDS`, made with `settings` (its constructor's keywords)."""
    rule: SyncRule = rule_kind(name).build()(**settings)
    return rule


__all__ = ["Asynchronous", "BulkSynchronous", "Exchange", "SyncRule", "make_rule"]
