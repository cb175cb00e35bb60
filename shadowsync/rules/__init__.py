"""What a synchronization does to tensors: small, pure update rules.

A rule sees one trainer's flattened parameters and an `Exchange` (how it reaches the other
trainers or the parameter servers), and returns the new value of the local parameters. It
knows nothing of threads, processes or timing; the runners in `shadowsync.runners` decide when
a rule runs, and `shadowsync.transport` how its bytes move.

Adding an algorithm is one new module plus one line in `RULES`. The parameter-server protocols
of Sync-Switch (`bsp`, `asp`, with `server_update`) act on a server's state instead of a
trainer's replica, so they are not in `RULES`.
"""

from __future__ import annotations

from collections.abc import Callable

from shadowsync.rules.asp import Asynchronous
from shadowsync.rules.base import Exchange, SyncRule
from shadowsync.rules.bmuf import BlockwiseModelUpdateFiltering
from shadowsync.rules.bsp import BulkSynchronous
from shadowsync.rules.easgd import ElasticAveraging
from shadowsync.rules.ma import ModelAveraging

RULES: dict[str, Callable[..., SyncRule]] = {
    "ma": ModelAveraging,
    "bmuf": BlockwiseModelUpdateFiltering,
    "easgd": ElasticAveraging,
}


def make_rule(name: str, **settings: object) -> SyncRule:
    return RULES[name](**settings)


__all__ = ["RULES", "Asynchronous", "BulkSynchronous", "Exchange", "SyncRule", "make_rule"]
