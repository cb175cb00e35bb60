"""Every `--tables` kind, in one table: how a run's embedding tables turn ids into rows.

An entry names its kind's builder as "module:Class" (a `TableBuilder` of
`shadowsync.train.table_kinds.kind`), imported only when tables are made, served, saved or
exported (`table_builder(cfg.model)`), so this table stays a leaf the configuration reads
for `--tables`' choices and help and for which options apply. Adding a kind is one module
with its builder plus one entry here; code never compares a kind's name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

KINDS = "shadowsync.train.table_kinds"


@dataclass(frozen=True)
class TableKind:
    name: str
    help: str
    builder: str  # "module:Class" of a TableBuilder
    # Whether the options of id maps apply (--admit-after, --evict, --table-memory), and
    # what they rule out (--prefetch, --embedding-transport unshared): raw 64-bit ids mapped
    # to rows as they come, within a budget of rows (a `DynamicSpec` per holder).
    maps_ids: bool = False

    def build(self) -> object:
        """The kind's builder (`table_builder` checks that it is a TableBuilder)."""
        module, _, cls = self.builder.partition(":")
        return getattr(importlib.import_module(module), cls)()


TABLE_KINDS: dict[str, TableKind] = {k.name: k for k in [
    TableKind("fixed", "ids modulo --table-size", f"{KINDS}.fixed:Fixed"),
    TableKind("dynamic", "raw 64-bit ids mapped to rows as they come, --table-size rows per "
              "table as the budget; see docs/dynamic-tables.md", f"{KINDS}.dynamic:Dynamic",
              maps_ids=True),
]}

TABLE_CHOICES = tuple(TABLE_KINDS)
DEFAULT_TABLES = "fixed"
TABLES_HELP = "embedding tables: " + "; ".join(f"{k.name} ({k.help})"
                                               for k in TABLE_KINDS.values())
