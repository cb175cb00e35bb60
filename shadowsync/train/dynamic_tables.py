"""How a run's --tables dynamic options become each holder's `DynamicSpec` (a trainer
without embedding servers, every server, a checkpoint read back)."""

from __future__ import annotations

from shadowsync.config import ModelConfig
from shadowsync.embeddings.dynamic import MAX_TABLES
from shadowsync.embeddings.dynamic_tables import DynamicSpec, pool_rows
from shadowsync.errors import UserError
from shadowsync.train.tasks.base import Features


def dynamic_spec(m: ModelConfig, batch_size: int, features: Features,
                 holders: int) -> DynamicSpec:
    """How each of `holders` (the trainer, or each embedding server) keeps --tables dynamic:
    its pool's rows from --table-size (rows per table) or --table-memory (the job's bytes).
    A budget below one batch's lookups (`batch_size`: --batch-size) could not hold the batch
    it is reading: refused."""
    if features.num_tables > MAX_TABLES:
        raise UserError(f"--tables dynamic: the data has {features.num_tables} categorical "
                        f"features; dynamic tables take at most {MAX_TABLES}")
    rows = pool_rows(features.table_rows, m.table_width(), m.admit_after,
                     m.table_memory.bytes if m.table_memory is not None else None, holders)
    lookups = batch_size * features.num_tables
    if rows * holders < lookups:
        given = (f"--table-memory {m.table_memory}" if m.table_memory is not None
                 else f"--table-size {','.join(map(str, m.table_size))}")
        raise UserError(f"{given}: dynamic tables of {rows * holders:,} rows in all cannot hold "
                        f"one batch's {lookups:,} ids (--batch-size x {features.num_tables} "
                        "features); raise the budget")
    return DynamicSpec(features.num_tables, rows, m.admit_after, m.evict,
                       init_rows=max(features.table_rows))
