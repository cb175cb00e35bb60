"""A set of embedding tables with a sparse optimizer applied in place.

All tables handled by one holder (a trainer, or one embedding parameter server) live in one
fused weight matrix with a row offset per table, so a batch's lookup is a single gather and
its update a single scatter however many features there are. Ids [B, T] (one per feature,
as in Criteo) are looked up as they are; a batch with multi-hot features comes as `Bags`
(see `shadowsync.data.bags`), its rows read, then pooled per example and feature.

The weights and the optimizer state can be placed in shared memory; Hogwild workers then
read and update them without locks, as in Recht et al. 2011 and the ShadowSync trainers.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import torch

from shadowsync.data.bags import Bags
from shadowsync.embeddings.unique import unique_with_inverse

# DLRM draws a table's rows uniformly in +-1/sqrt(rows): a 3-row table (a gender) starts at
# +-0.58, and its vectors' dot products with every other feature's swamp the first steps of
# the interaction; the model then fits noise before it fits the signal. Small tables start as
# a table of this many rows would (+-0.032); larger ones as DLRM does. On MovieLens 100K
# (tables of 3 to 1,683 rows) the default job's eval AUC rose from 0.767-0.771 to 0.780-0.781
# (two seeds, 10 epochs, best of a validation tail); a bound of 0.01 gave 0.776. The synthetic
# and Criteo defaults (100,000 rows a table) start as before.
INIT_MIN_ROWS = 1000


class SparseOptimizer(str, Enum):
    SGD = "sgd"
    ADAGRAD = "adagrad"  # row-wise: one accumulator per row, as in DLRM/TorchRec


def per_table(value: float | Sequence[float], tables: int, what: str) -> list[float]:
    """One value for every table, or one per table (a ValueError naming `what` when their
    number is not the tables')."""
    values = list(value) if isinstance(value, Sequence) else [value] * tables
    if len(values) != tables:
        raise ValueError(f"{len(values)} {what} for {tables} tables")
    return values


class EmbeddingTables:
    """Tables of `rows[i]` x `dim` floats, updated by sparse SGD or row-wise Adagrad."""

    def __init__(
        self,
        rows: list[int],
        dim: int,
        optimizer: SparseOptimizer | str = SparseOptimizer.ADAGRAD,
        lr: float = 0.05,
        seed: int = 0,
        eps: float = 1e-8,
        initial_accumulator: float | Sequence[float] = 0.0,
        weight_decay: float | Sequence[float] = 0.0,
    ) -> None:
        """`initial_accumulator`: where every row's Adagrad accumulator starts, or one value
        per table; `weight_decay` likewise (see `apply_rows`)."""
        self._set_layout(rows, dim, optimizer, lr, eps, weight_decay)
        total = sum(self.rows)
        gen = torch.Generator().manual_seed(seed)
        # DLRM's initialisation, uniform in +-1/sqrt(rows) of each table, but no wider than a
        # table of INIT_MIN_ROWS rows gets (see there).
        bounds = torch.cat([torch.full((r,), max(r, INIT_MIN_ROWS)**-0.5)
                            for r in self.rows]).unsqueeze(1)
        self.weight = (torch.rand(total, dim, generator=gen) * 2 - 1) * bounds
        # A row's Adagrad step is its gradient over sqrt(accumulator): from zero, the first
        # step of a row is a full `lr` whatever its gradient, so a rare id's vector is set by
        # the one or two examples it came with. Starting the accumulator above zero shrinks
        # those first steps and leaves a frequent row's later ones as they were (see
        # `OptimConfig.table_initial_accumulators` for why a multi-hot feature's table differs).
        starts = per_table(initial_accumulator, len(self.rows), "initial accumulators")
        self.state = (torch.repeat_interleave(torch.tensor(starts, dtype=torch.float32),
                                              torch.tensor(self.rows, dtype=torch.long))
                      if self.optimizer is SparseOptimizer.ADAGRAD else None)

    @classmethod
    def from_tensors(cls, rows: list[int], dim: int, optimizer: SparseOptimizer | str, lr: float,
                     eps: float, weight: torch.Tensor,
                     state: torch.Tensor | None,
                     weight_decay: float | Sequence[float] = 0.0) -> EmbeddingTables:
        """Tables over existing weight and optimizer-state tensors (for example another
        process's, mapped from shared memory): no initialisation, updates land in them."""
        tables = cls.__new__(cls)
        tables._set_layout(rows, dim, optimizer, lr, eps, weight_decay)
        if weight.shape != (sum(tables.rows), dim):
            raise ValueError(f"weight of shape {tuple(weight.shape)} for {sum(rows)} rows x {dim}")
        tables.weight = weight
        tables.state = state if tables.optimizer is SparseOptimizer.ADAGRAD else None
        return tables

    def _set_layout(self, rows: list[int], dim: int, optimizer: SparseOptimizer | str,
                    lr: float, eps: float, weight_decay: float | Sequence[float] = 0.0) -> None:
        self.rows = list(rows)
        self.weight_decay = weight_decay  # as given: a client mapping these rows takes it
        decays = per_table(weight_decay, len(self.rows), "weight decays")
        # None: no table decays; else each table's decay, looked up by a row's table
        self._table_decay = (torch.tensor(decays, dtype=torch.float32) if any(decays)
                             else None)
        self.dim = dim
        self.optimizer = SparseOptimizer(optimizer)
        self.lr = lr
        self.eps = eps
        self.offsets = torch.tensor([0] + self.rows[:-1], dtype=torch.long).cumsum(0)

    def share_memory_(self) -> EmbeddingTables:
        self.weight.share_memory_()
        if self.state is not None:
            self.state.share_memory_()
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights and the optimizer state (live tensors: loading copies into them)."""
        return {"weight": self.weight, **({"adagrad": self.state} if self.state is not None
                                          else {})}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.weight.copy_(state["weight"])
            if self.state is not None:
                self.state.copy_(state["adagrad"])

    # Local tables are already in every worker's address space; remote clients connect here.
    def flush(self) -> None:
        """Nothing in flight: every gradient is applied in place when pushed."""

    def counters(self) -> None:
        return None  # fixed tables: no id maps to count

    def saved_here(self) -> EmbeddingTables:
        return self  # the rows live in the trainer: its shard saves them

    def attach(self, name: str) -> None:
        pass

    def detach(self) -> None:
        pass

    def _flat_ids(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        if isinstance(ids, Bags):
            return self.offsets.index_select(0, ids.tables) + ids.ids
        return (ids + self.offsets).reshape(-1)

    def lookup(self, ids: torch.Tensor | Bags) -> torch.Tensor:
        """ids [B, num_tables] (already < rows), or Bags -> vectors [B, num_tables, dim]."""
        if isinstance(ids, Bags):
            return ids.pool(self.weight, self._flat_ids(ids))
        return self.lookup_rows(self._flat_ids(ids)).view(*ids.shape, self.dim)

    def apply_gradients(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                        lr_scale: float = 1.0) -> None:
        """Apply d(loss)/d(vectors) [B, num_tables, dim] to the rows ids point at."""
        per_row = ids.unpool(grads) if isinstance(ids, Bags) else grads.reshape(-1, self.dim)
        self.apply_rows(self._flat_ids(ids), per_row, lr_scale=lr_scale)

    def update_and_lookup(self, ids: torch.Tensor | Bags, grads: torch.Tensor,
                          next_ids: torch.Tensor | Bags | None,
                          lr_scale: float = 1.0) -> torch.Tensor | None:
        """Apply one step's gradients, then read the next step's vectors (if any)."""
        self.apply_gradients(ids, grads, lr_scale)
        return self.lookup(next_ids) if next_ids is not None else None

    def lookup_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows of the fused weight matrix by flat index -> [n, dim]."""
        return self.weight.index_select(0, rows)

    def apply_rows(self, rows: torch.Tensor, grads: torch.Tensor, unique: bool = False,
                   lr_scale: float = 1.0) -> None:
        """Apply gradients [n, dim] to rows of the fused weight matrix at `lr_scale` times the
        tables' learning rate (a schedule's factor). Repeats are allowed unless `unique` says
        the caller has already summed them.

        With `weight_decay` wd (its table's, where it is given per table), each row the batch
        read takes the gradient of ``loss + wd/2 * ||w||^2`` once: ``g_row = sum of its
        gradients + wd * w_row``, the L2 penalty on the rows a batch reads (rows never read
        are left alone, as sparse optimizers do), inside the row-wise Adagrad step."""
        lr = self.lr * lr_scale
        if self._table_decay is not None:
            if not unique:
                rows, inverse = unique_with_inverse(rows)
                grads = torch.zeros(len(rows), self.dim).index_add_(0, inverse, grads)
                unique = True
            table = torch.bucketize(rows, self.offsets, right=True) - 1
            decay = self._table_decay.index_select(0, table).unsqueeze(1)
            grads = grads + decay * self.weight.index_select(0, rows)
        # The steps are scaled before index_add_ rather than through its `alpha`: on a large
        # table torch's CPU index_add_ with alpha != 1 took 3.4x as long (1.0 ms against 0.3 ms
        # for 2,300 rows of a 2.6M-row table), a seventh of a whole training step.
        if self.optimizer is SparseOptimizer.SGD:
            self.weight.index_add_(0, rows, grads * -lr)
            return
        # Row-wise Adagrad sums the gradients of repeated ids before updating the accumulator,
        # so a row seen twice in a batch takes one step, as a dense Adagrad would.
        if unique:
            summed = grads
        else:
            rows, inverse = unique_with_inverse(rows)
            summed = torch.zeros(len(rows), self.dim).index_add_(0, inverse, grads)
        unique = rows
        assert self.state is not None
        acc = self.state.index_select(0, unique) + summed.pow(2).mean(1)
        self.state.index_copy_(0, unique, acc)
        step = summed / (acc.sqrt() + self.eps).unsqueeze(1)
        self.weight.index_add_(0, unique, step.mul_(-lr))
