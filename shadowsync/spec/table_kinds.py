"""Every `--tables` kind, in one table: how a run's embedding tables turn ids into rows.

Code that builds, serves, saves or exports tables asks the kind's entry
(`cfg.model.table_kind.maps_ids`), never compares its name; the configuration takes
`--tables`' choices and help from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableKind:
    name: str
    help: str
    # Raw 64-bit ids mapped to rows as they come, within a budget of rows (a `DynamicSpec`
    # per holder: --admit-after, --evict, --table-memory apply); else ids modulo --table-size.
    maps_ids: bool


TABLE_KINDS: dict[str, TableKind] = {k.name: k for k in [
    TableKind("fixed", "ids modulo --table-size", maps_ids=False),
    TableKind("dynamic", "raw 64-bit ids mapped to rows as they come, --table-size rows per "
              "table as the budget; see docs/dynamic-tables.md", maps_ids=True),
]}

TABLE_CHOICES = tuple(TABLE_KINDS)
DEFAULT_TABLES = "fixed"
TABLES_HELP = "embedding tables: " + "; ".join(f"{k.name} ({k.help})"
                                               for k in TABLE_KINDS.values())
