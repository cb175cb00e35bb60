"""What a synchronization does to tensors: small, pure update rules.

A rule sees one trainer's flattened parameters and an `Exchange` (how it reaches the other
trainers or the parameter servers), and returns the new value of the local parameters. It
knows nothing of threads, processes or timing; the runners in `shadowsync.runners` decide when
a rule runs, and `shadowsync.transport` how its bytes move.

Adding an algorithm is one new module plus one line in `RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shadowsync.rules.base import Exchange, SyncRule
from shadowsync.rules.bmuf import BlockwiseModelUpdateFiltering
from shadowsync.rules.easgd import ElasticAveraging
from shadowsync.rules.ma import ModelAveraging

RULES: dict[str, Callable[..., SyncRule]] = {
    "ma": ModelAveraging,
    "bmuf": BlockwiseModelUpdateFiltering,
    "easgd": ElasticAveraging,
}


def make_rule(name: str, **settings: Any) -> SyncRule:
    return RULES[name](**settings)


__all__ = ["RULES", "Exchange", "SyncRule", "make_rule"]
