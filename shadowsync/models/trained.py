"""A trained model as one plain PyTorch module: the embedding tables and the dense model.

Training keeps the tables apart from the dense model (fused matrices in a trainer's shared
memory, or pieces on embedding servers). `TrainedModel` puts them back together as ordinary
torch modules, one `nn.EmbeddingBag` per categorical feature under the feature's name, so
the result can be scored, inspected, fine-tuned, saved with `torch.save` or exported with
`torch.export` without shadowsync.

Every feature is looked up as a bag: values, per-example offsets and the bag's pooling. A
single-id feature has one id per example, so its bags hold one id each and pooling changes
nothing; all of them come in as one tensor ids [B, S]. A multi-hot feature (`SparseFeature`
with ``multi_hot``) comes in as its own values [nnz], lengths [B] (example b's ids are the
next lengths[b] values) and, when weighted, weights [nnz], as TorchRec's KeyedJaggedTensor
holds one key, pooled as training pooled it (docs/multi-hot.md):

    sum:  v_b = sum_l w_l r(x_l)          mean: v_b = (1 / n_b) sum_l w_l r(x_l)

(w_l = 1 unweighted, n_b the bag's ids, an empty bag pools to zero). As in the data, the
single-id features come first, then the multi-hot ones. (`predict` takes offsets [n + 1], as
array directories store them; `forward`, and so the exported program, lengths: then the batch
size is the only size its inputs share, and torch.export leaves it free, 1 included.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from shadowsync.data.bags import POOLINGS, Bags
from shadowsync.data.buckets import bucket_ids
from shadowsync.data.ids import STRING_RULE, raw_ids
from shadowsync.embeddings.dynamic import raw_keys_torch

OUTPUTS = ("sigmoid", "softmax")  # a click probability per example, or class probabilities


@dataclass(frozen=True)
class SparseFeature:
    """How one categorical feature is fed: one id per example, or a bag pooled by `pooling`,
    with one weight per id when `weighted`. A bucketized feature's id is the number of
    `edges` at or below its numeric column `bucketize`'s value (the schema's rule, carried
    to the exported model's schema so that a caller cuts numbers as training did)."""

    name: str
    multi_hot: bool = False
    pooling: str = "sum"
    weighted: bool = False
    bucketize: str | None = None
    edges: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"feature {self.name}: pooling must be one of {POOLINGS}, "
                             f"got {self.pooling!r}")


def unsigned_remainder(ids: torch.Tensor, rows: int | torch.Tensor) -> torch.Tensor:
    """``u mod rows`` of int64 words read as unsigned 64-bit numbers u (a negative word x is
    u = x + 2^64), in torch operations an exported program keeps:
    ``(x mod rows + [x < 0] * (2^64 mod rows)) mod rows``, where
    ``2^64 mod rows = 2 * ((2^63 - 1) mod rows + 1) mod rows`` (every term below rows)."""
    rest = ((2 * (((1 << 63) - 1) % rows + 1)) % rows)  # 2^64 mod rows
    return (ids.remainder(rows) + (ids < 0).long() * rest).remainder(rows)


def _module_key(name: str) -> str:
    """A feature name as an `nn.ModuleDict` key, which cannot hold a dot nor be one of its
    attributes (``items``, ``values``...): those get a trailing underscore."""
    key = name.replace(".", "_")
    return f"{key}_" if not key or hasattr(nn.ModuleDict, key) else key


def _is_rows(value: object) -> bool:
    """Whether `predict`'s first argument is raw rows (a table of named columns)."""
    return isinstance(value, Mapping) or hasattr(value, "column_names") or (
        type(value).__module__.startswith("pandas") and hasattr(value, "columns"))


def _numbers(column: object, name: str) -> np.ndarray:
    values = np.asarray(column, dtype=np.float64)  # a null (pyarrow, pandas) reads as NaN
    if not np.isfinite(values).all():
        raise ValueError(f"rows: column {name!r}: {values[~np.isfinite(values)][0]} is not a "
                         "finite number")
    return values


def _lists(column: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A column of lists of ids -> (values by `raw_ids`, offsets [n + 1])."""
    if hasattr(column, "combine_chunks"):  # pyarrow
        column = column.combine_chunks()
    if hasattr(column, "offsets"):
        offsets = column.offsets.to_numpy().astype(np.int64)
        return _ids(column.flatten(), name), offsets - offsets[0]
    lists = [list(v) if v is not None else [] for v in column]
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in lists], out=offsets[1:])
    return _ids([x for v in lists for x in v], name), offsets


def _ids(column: object, name: str) -> np.ndarray:
    try:
        return raw_ids(column)
    except ValueError as e:
        raise ValueError(f"rows: column {name!r}: {e}") from None


def _as_tensor(value: Any, dtype: np.dtype, what: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(value, dtype=dtype))
    if t.dim() != 1:
        raise ValueError(f"{what} must be one-dimensional, got {list(t.shape)}")
    return t


class TrainedModel(nn.Module):
    """`forward(dense [B, num_dense], sparse [B, S] int64, *bags) -> logits`, `bags` being
    each multi-hot feature's values, lengths (and weights when weighted) in feature order;
    ids are taken modulo each table's rows, as training took them, or with `id_keys` (dynamic
    tables: each table's sorted keys, row 0 the default) as raw ids mapped by them. `predict` gives
    probabilities, batched, with the multi-hot features as a dict by name."""

    def __init__(self, dense_model: nn.Module, tables: Mapping[str, torch.Tensor],
                 num_dense: int, output: str = "sigmoid",
                 features: Sequence[SparseFeature] | None = None,
                 id_keys: Sequence[torch.Tensor] | None = None,
                 dense_names: Sequence[str] | None = None) -> None:
        super().__init__()
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if features is None:
            features = [SparseFeature(name) for name in tables]
        features = tuple(features)
        if len(features) != len(tables):
            raise ValueError(f"{len(features)} features for {len(tables)} tables")
        single = self._count_single(features)
        if any(f.multi_hot for f in features[:single]):
            raise ValueError("single-id features come first, then the multi-hot ones")
        if len({_module_key(f.name) for f in features}) != len(features):
            raise ValueError(f"feature names are not distinct: {[f.name for f in features]}")
        self.features = features
        self.num_single = single
        self.dense_model = dense_model
        self.tables = nn.ModuleDict({
            _module_key(f.name): nn.EmbeddingBag.from_pretrained(
                weight, freeze=False, mode="sum")
            for f, weight in zip(features, tables.values(), strict=True)})
        self.register_buffer("table_rows", torch.tensor([len(w) for w in tables.values()],
                                                        dtype=torch.long))
        self.num_dense = num_dense
        # The training data's dense columns, what `predict` reads from raw rows.
        self.dense_names = (tuple(dense_names) if dense_names is not None
                            else tuple(f"I{i + 1}" for i in range(num_dense)))
        if len(self.dense_names) != num_dense:
            raise ValueError(f"{len(self.dense_names)} dense names for {num_dense} dense inputs")
        self.output = output
        # Dynamic tables: raw ids, mapped to rows by each table's sorted keys (see `_rows`).
        self.raw_ids = id_keys is not None
        for i, keys in enumerate(id_keys or []):
            if len(keys) != int(self.table_rows[i]):
                raise ValueError(f"feature {features[i].name}: {len(keys)} id keys for "
                                 f"{int(self.table_rows[i])} rows")
            self.register_buffer(f"id_keys_{i}", keys)
        self.eval()

    def _rows(self, table: int, ids: torch.Tensor, rows: int | torch.Tensor) -> torch.Tensor:
        """The rows of table `table` that ids read. Fixed tables: ``id mod rows``, the id
        taken as an unsigned 64-bit word (as training folds it). Dynamic
        tables (raw ids): row j holds the id whose key (`raw_keys_torch`) is the table's
        j-th sorted key; key 0 is below every key and belongs to the default row (zeros),
        which every id the map did not hold reads."""
        if not self.raw_ids:
            return unsigned_remainder(ids, rows)
        sorted_keys = getattr(self, f"id_keys_{table}")
        keys = raw_keys_torch(table, ids)
        at = torch.searchsorted(sorted_keys, keys, right=True) - 1
        return torch.where(sorted_keys.index_select(0, at) == keys, at, torch.zeros_like(at))

    @staticmethod
    def _count_single(features: Sequence[SparseFeature]) -> int:
        return sum(1 for f in features if not f.multi_hot)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    def table(self, name: str) -> nn.EmbeddingBag:
        """The table of the feature `name` (``tables`` keys it by name, less dots, and with a
        trailing underscore where the name is a ModuleDict attribute such as ``items``)."""
        if name not in self.feature_names:
            raise KeyError(f"no feature {name!r}; the model's are {self.feature_names}")
        return self.tables[_module_key(name)]

    @property
    def multi_hot(self) -> list[SparseFeature]:
        """The multi-hot features, in the order `forward` takes their inputs."""
        return [f for f in self.features if f.multi_hot]

    @property
    def table_width(self) -> int:
        """Columns of every table's rows (the embedding width, plus one with --id-bias)."""
        return next(iter(self.tables.values())).embedding_dim if len(self.tables) else 0

    def embed(self, sparse: torch.Tensor | Bags, *bags: torch.Tensor) -> torch.Tensor:
        """ids [B, S] and the multi-hot inputs (see `forward`), or one `Bags` of every
        feature -> the pooled vectors [B, num_tables, table_width]."""
        if isinstance(sparse, Bags):
            return self._embed_bags(sparse)
        batch = sparse.shape[0]
        if len(self.tables) == 0:
            return torch.zeros(batch, 0, 0)
        modules = list(self.tables.values())
        pooled = []
        if self.num_single:
            offsets = torch.arange(batch, dtype=torch.long, device=sparse.device)
            pooled = [bag(self._rows(i, sparse[:, i], self.table_rows[i]), offsets)
                      for i, bag in enumerate(modules[:self.num_single])]
        expected = sum(2 + f.weighted for f in self.multi_hot)
        if len(bags) != expected:
            raise ValueError(f"the multi-hot features {self.multi_hot_inputs()} are "
                             f"{expected} tensors, got {len(bags)}")
        at = 0
        for t, (f, bag) in enumerate(zip(self.multi_hot, modules[self.num_single:], strict=True),
                                     start=self.num_single):
            values, lengths = bags[at], bags[at + 1]
            weights = bags[at + 2] if f.weighted else None
            at += 2 + f.weighted
            starts = torch.cumsum(lengths, 0) - lengths
            v = bag(self._rows(t, values, bag.num_embeddings), starts,
                    per_sample_weights=weights)
            if f.pooling == "mean":
                v = v / lengths.clamp(min=1).unsqueeze(1).to(v.dtype)
            pooled.append(v)
        return torch.stack(pooled, dim=1)

    def _embed_bags(self, bags: Bags) -> torch.Tensor:
        rows = torch.empty(len(bags.ids), self.table_width)
        for t, bag in enumerate(self.tables.values()):
            lookups = (bags.tables == t).nonzero().squeeze(1)
            ids = self._rows(t, bags.ids.index_select(0, lookups), int(self.table_rows[t]))
            rows.index_copy_(0, lookups, bag.weight.index_select(0, ids))
        return bags.pool(rows)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor | Bags | None = None,
                *bags: torch.Tensor) -> torch.Tensor:
        """Logits of dense float32 [B, num_dense], the single-id features' ids int64 [B, S]
        (None when S = 0) and, feature after feature in `multi_hot_inputs()` order, each
        multi-hot feature's values int64 [nnz], lengths int64 [B] (the bags' sizes: the
        offsets' differences) and, when weighted, weights float32 [nnz]. `sparse` may instead
        be a `Bags` of every feature."""
        if sparse is None:
            sparse = torch.zeros(dense.shape[0], 0, dtype=torch.long)
        return self.dense_model(dense, self.embed(sparse, *bags))

    def multi_hot_inputs(self) -> list[str]:
        """The names of the tensors `forward` takes after `sparse`, in order."""
        return [f"{f.name}.{part}" for f in self.multi_hot
                for part in ("values", "lengths", *(("weights",) if f.weighted else ()))]

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.output == "sigmoid" else torch.softmax(logits, 1)

    def _bag_inputs(self, n: int, multi_hot: Mapping[str, Any] | None
                    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """`predict`'s multi-hot dict, checked: (values, offsets, weights) per feature."""
        given = dict(multi_hot or {})
        names = [f.name for f in self.multi_hot]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"multi_hot: no multi-hot feature {unknown[0]!r} (the model's "
                             f"are {names or 'none'})")
        out = []
        for f in self.multi_hot:
            if f.name not in given:
                raise ValueError(f"multi_hot: feature {f.name!r} is missing: pass "
                                 f"multi_hot={{{f.name!r}: (values, offsets"
                                 f"{', weights' if f.weighted else ''})}}")
            parts = tuple(given[f.name])
            if len(parts) != 2 + f.weighted:
                raise ValueError(f"multi_hot[{f.name!r}]: expected (values, offsets"
                                 f"{', weights' if f.weighted else ''}), got {len(parts)} "
                                 f"arrays ({'weighted' if f.weighted else 'not weighted'})")
            values = _as_tensor(parts[0], np.int64, f"multi_hot[{f.name!r}] values")
            offsets = _as_tensor(parts[1], np.int64, f"multi_hot[{f.name!r}] offsets")
            if (len(offsets) != n + 1 or int(offsets[0]) != 0
                    or int(offsets[-1]) != len(values) or bool((offsets.diff() < 0).any())):
                raise ValueError(f"multi_hot[{f.name!r}] offsets must be {n + 1} non-decreasing"
                                 f" entries from 0 to len(values) = {len(values)}")
            weights = None
            if f.weighted:
                weights = _as_tensor(parts[2], np.float32, f"multi_hot[{f.name!r}] weights")
                if len(weights) != len(values):
                    raise ValueError(f"multi_hot[{f.name!r}]: {len(weights)} weights for "
                                     f"{len(values)} values")
            out.append((values, offsets, weights))
        return out

    def _cut_from_dense(self) -> list[tuple[int, int, tuple[float, ...]]]:
        """(feature, dense input, edges) of each single-id feature that bucketizes a dense
        input (--buckets' quantile features)."""
        return [(j, self.dense_names.index(f.bucketize), f.edges)
                for j, f in enumerate(self.features[:self.num_single])
                if f.bucketize in self.dense_names]

    def _with_buckets(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """`ids` [n, S] as they are, or [n, S - k] less the k features cut from a dense
        input: those cut from `dense` at their edges (`bucket_ids`) and put in their places."""
        cut = self._cut_from_dense()
        if not cut or ids.dim() != 2 or ids.shape[1] != self.num_single - len(cut):
            return ids
        full = torch.empty(len(ids), self.num_single, dtype=torch.long)
        given = [j for j in range(self.num_single) if j not in {c[0] for c in cut}]
        full[:, given] = ids
        for j, column, edges in cut:
            full[:, j] = torch.from_numpy(bucket_ids(edges, dense[:, column].numpy()))
        return full

    def columns(self) -> list[str]:
        """The columns `predict` reads from raw rows: the training data's dense columns, then
        each categorical feature's (a bucketized feature's numeric column)."""
        return list(dict.fromkeys([*self.dense_names,
                                   *(f.bucketize or f.name for f in self.features)]))

    def inputs(self, rows: object) -> tuple[np.ndarray, np.ndarray, dict[str, tuple]]:
        """Raw rows as the training data has them (a pyarrow Table, a dict of columns, a
        pandas DataFrame) -> `predict`'s (dense, sparse, multi_hot): numbers as float32,
        categorical values by `raw_ids` (integers their 64-bit pattern, strings hashed) as
        training read them, a bucketized feature's bucket of its column, list columns as
        multi-hot values and offsets. Other columns (the label) are ignored."""
        columns = (dict(zip(rows.column_names, rows.columns)) if hasattr(rows, "column_names")
                   else {str(k): v for k, v in rows.items()})  # a dict, a pandas DataFrame
        missing = [c for c in self.columns() if c not in columns]
        if missing:
            raise ValueError(f"rows: no column {missing[0]!r} (the model reads "
                             f"{', '.join(self.columns())})")
        n = len(columns[self.columns()[0]]) if self.columns() else 0
        dense = np.zeros((n, self.num_dense), dtype=np.float32)
        for j, name in enumerate(self.dense_names):
            dense[:, j] = _numbers(columns[name], name)
        sparse = np.zeros((n, self.num_single), dtype=np.int64)
        multi_hot: dict[str, tuple] = {}
        for j, f in enumerate(self.features):
            if f.bucketize:
                values = _numbers(columns[f.bucketize], f.bucketize)
                sparse[:, j] = bucket_ids(f.edges, values)
            elif not f.multi_hot:
                sparse[:, j] = _ids(columns[f.name], f.name)
            elif f.weighted:
                raise ValueError(f"rows: feature {f.name!r} is weighted: pass its values, "
                                 "offsets and weights with multi_hot=")
            else:
                multi_hot[f.name] = _lists(columns[f.name], f.name)
        return dense, sparse, multi_hot

    @torch.no_grad()
    def predict(self, dense: Any, sparse: Any = None, batch_size: int = 65_536, *,
                multi_hot: Mapping[str, Any] | None = None) -> torch.Tensor:
        """Probabilities for rows of `dense` [n, num_dense], `sparse` [n, S] (the single-id
        features; tensors or arrays) and `multi_hot` {name: (values, offsets[, weights])},
        offsets [n + 1] as in an array directory, `batch_size` rows at a time: [n] clicks, or
        [n, classes]. `sparse` may instead be a `Bags` of every feature (scored whole), or
        leave out the features that bucketize a dense input (--buckets' NAME_quantile), which
        are then cut from `dense` at their edges.

        Or raw rows alone, as the training data has them (`model.predict(table)`: a pyarrow
        Table, a dict of columns or a pandas DataFrame with the columns of `columns()`,
        strings included; see `inputs`)."""
        if sparse is None and multi_hot is None and _is_rows(dense):
            dense, sparse, multi_hot = self.inputs(dense)
        x = torch.as_tensor(np.asarray(dense, dtype=np.float32))
        n = len(x)
        if isinstance(sparse, Bags):  # a batch of multi-hot features, scored whole
            if sparse.shape != (n, len(self.tables)):
                raise ValueError(f"sparse bags are {list(sparse.shape)}, expected "
                                 f"[{n}, {len(self.tables)}]")
            return self.probabilities(self(x, sparse))
        ids = (torch.zeros(n, 0, dtype=torch.long) if sparse is None
               else torch.as_tensor(np.asarray(sparse, dtype=np.int64)))
        if x.dim() != 2 or x.shape[1] != self.num_dense:
            raise ValueError(f"dense must be [n, {self.num_dense}], got {list(x.shape)}")
        ids = self._with_buckets(x, ids)
        if ids.dim() != 2 or ids.shape != (n, self.num_single):
            cut = len(self._cut_from_dense())
            raise ValueError(f"sparse must be [{n}, {self.num_single}] (the single-id "
                             "features" + (f"; or [{n}, {self.num_single - cut}] without the "
                                           f"{cut} cut from dense" if cut else "")
                             + f"), got {list(ids.shape)}")
        bags = self._bag_inputs(n, multi_hot)
        was_training = self.training
        self.eval()
        parts = []
        try:
            for i in range(0, n, batch_size):
                j = min(i + batch_size, n)
                cut: list[torch.Tensor] = []
                for values, offsets, weights in bags:
                    lo, hi = int(offsets[i]), int(offsets[j])
                    cut += [values[lo:hi], offsets[i + 1:j + 1] - offsets[i:j]]
                    if weights is not None:
                        cut.append(weights[lo:hi])
                parts.append(self.probabilities(self(x[i:j], ids[i:j], *cut)))
        finally:
            self.train(was_training)
        if parts:
            return torch.cat(parts)
        return torch.zeros((0,) if self.output == "sigmoid" else (0, 0))

    def schema(self) -> dict[str, Any]:
        """What the inputs are: the feature schema an exported model is shipped with."""
        features = []
        for f, rows in zip(self.features, self.table_rows.tolist(), strict=True):
            entry: dict[str, Any] = {"name": f.name, "rows": int(rows)}
            if self.raw_ids:  # the map travels in the module, as buffer id_keys_<i>
                entry["ids"] = "raw"
            if f.multi_hot:
                entry.update({k: asdict(f)[k] for k in ("multi_hot", "pooling", "weighted")})
            if f.bucketize:
                entry.update({"bucketize": f.bucketize, "edges": list(f.edges)})
            features.append(entry)
        return {"dense_width": self.num_dense, "dense": list(self.dense_names),
                "features": features, "table_width": self.table_width, "output": self.output,
                # how a column's values become the ids the program takes (`raw_ids`)
                "ids": {"integers": "the value's 64-bit two's-complement bit pattern, as int64",
                        "strings": f"{STRING_RULE}: the first 8 bytes of blake2b(UTF-8 text), "
                                   "a little-endian 64-bit word, as int64",
                        "function": "shadowsync.data.ids.raw_ids"}}
