"""The plain-PyTorch model `shadowsync.load` returns, on small hand-made tables: lookups are the
rows asked for (ids modulo the table size), `predict` batches without changing a number, and
an export that torch.export cannot trace is one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shadowsync.errors import UserError
from shadowsync.models.trained import TrainedModel
from shadowsync.train.exported import export_program


class SumOfRows(nn.Module):
    """logit = sum of the dense features + sum of every looked-up vector's entries."""

    def forward(self, dense, emb):
        return dense.sum(1) + emb.sum((1, 2))


def model(dense_model: nn.Module | None = None) -> TrainedModel:
    tables = {"C1": torch.arange(6.0).view(3, 2), "C2": 10 * torch.arange(10.0).view(5, 2)}
    return TrainedModel(dense_model or SumOfRows(), tables, num_dense=2)


def test_lookups_take_each_row_and_ids_modulo_the_table():
    m = model()
    emb = m.embed(torch.tensor([[1, 4], [4, 7]]))  # C1 row 1, C2 row 4; C1 row 1, C2 row 2
    assert emb.tolist() == [[[2.0, 3.0], [80.0, 90.0]], [[2.0, 3.0], [40.0, 50.0]]]
    logits = m(torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[1, 4], [4, 7]]))
    assert logits.tolist() == [3 + 5 + 170, 5 + 90]
    assert m.feature_names == ["C1", "C2"] and m.table_width == 2
    assert m.schema()["features"] == [{"name": "C1", "rows": 3}, {"name": "C2", "rows": 5}]


def test_predict_batches_without_changing_a_number():
    m = model()
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(103, 2, generator=gen) / 100
    ids = torch.randint(0, 50, (103, 2), generator=gen)
    whole = torch.sigmoid(m(dense, ids))
    assert torch.equal(m.predict(dense, ids, batch_size=10), whole)
    assert torch.equal(m.predict(dense.numpy(), ids.numpy()), whole)  # arrays too
    with pytest.raises(ValueError, match=r"sparse must be \[103, 2\]"):
        m.predict(dense, ids[:, :1])


def test_the_exported_program_gives_the_same_logits_for_any_batch():
    m = model()
    program = export_program(model(), "sum-of-rows").module()
    for n in (1, 7):
        dense, ids = torch.ones(n, 2), torch.arange(2 * n).view(n, 2)
        with torch.no_grad():
            assert torch.equal(program(dense, ids), m(dense, ids))


class DataDependent(nn.Module):
    def forward(self, dense, emb):
        if dense.sum() > 0:  # Python control flow on a value: torch.export cannot trace it
            return dense.sum(1)
        return emb.sum((1, 2))


def test_a_model_torch_export_cannot_trace_is_one_line():
    with pytest.raises(UserError, match="torch.export cannot trace --model mine") as e:
        export_program(model(DataDependent()), "mine")
    assert "\n" not in str(e.value)


# --- multi-hot features: a single-id C1, a summed `items`, a weighted mean `tags` ------------

def multi_hot_model() -> TrainedModel:
    from shadowsync.models.trained import SparseFeature

    tables = {"C1": torch.arange(6.0).view(3, 2), "items": 10 * torch.arange(10.0).view(5, 2),
              "tags": 100 * torch.arange(8.0).view(4, 2)}
    features = [SparseFeature("C1"), SparseFeature("items", multi_hot=True),
                SparseFeature("tags", multi_hot=True, pooling="mean", weighted=True)]
    return TrainedModel(SumOfRows(), tables, num_dense=2, features=features)


def test_multi_hot_bags_pool_as_the_closed_forms():
    m = multi_hot_model()
    # example 0: C1 id 1, items {1, 6 -> 1}, tags {0 w 0.5, 3 w 2}; example 1: C1 id 2, no items,
    # tags {2 w 1}
    emb = m.embed(torch.tensor([[1], [2]]), torch.tensor([1, 6]), torch.tensor([2, 0]),
                  torch.tensor([0, 3, 2]), torch.tensor([2, 1]), torch.tensor([0.5, 2, 1]))
    rows = {"C1": torch.arange(6.0).view(3, 2), "items": 10 * torch.arange(10.0).view(5, 2),
            "tags": 100 * torch.arange(8.0).view(4, 2)}
    expected = torch.stack([
        torch.stack([rows["C1"][1], 2 * rows["items"][1],
                     (0.5 * rows["tags"][0] + 2 * rows["tags"][3]) / 2]),
        torch.stack([rows["C1"][2], torch.zeros(2), rows["tags"][2]])])
    assert torch.allclose(emb, expected)
    assert m.multi_hot_inputs() == ["items.values", "items.lengths", "tags.values",
                                    "tags.lengths", "tags.weights"]
    assert m.schema()["features"][1:] == [
        {"name": "items", "rows": 5, "multi_hot": True, "pooling": "sum", "weighted": False},
        {"name": "tags", "rows": 4, "multi_hot": True, "pooling": "mean", "weighted": True}]


def _random_bags(n: int, gen: torch.Generator) -> dict:
    def bag(max_len: int, ids: int, weighted: bool):
        lengths = torch.randint(0, max_len + 1, (n,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        values = torch.randint(0, ids, (int(offsets[-1]),), generator=gen)
        weights = torch.rand(len(values), generator=gen)
        return (values, offsets, weights) if weighted else (values, offsets)
    return {"items": bag(4, 40, False), "tags": bag(3, 9, True)}


def test_predict_takes_multi_hot_features_by_name_and_batches_them():
    from shadowsync.data.bags import Bags

    m = multi_hot_model()
    gen = torch.Generator().manual_seed(1)
    n = 57
    dense, ids = torch.randn(n, 2, generator=gen) / 100, torch.randint(0, 9, (n, 1), generator=gen)
    bags = _random_bags(n, gen)
    whole = m.predict(dense, ids, multi_hot=bags, batch_size=n)
    assert torch.equal(m.predict(dense, ids, multi_hot=bags, batch_size=5), whole)
    numpy_bags = {k: tuple(t.numpy() for t in v) for k, v in bags.items()}
    assert torch.equal(m.predict(dense.numpy(), ids.numpy(), multi_hot=numpy_bags), whole)
    # the same rows as the training batches carry them (one `Bags` of every feature)
    as_bags = Bags.build(ids % 3, [(bags["items"][0] % 5, bags["items"][1], None, "sum"),
                                   (bags["tags"][0] % 4, bags["tags"][1], bags["tags"][2],
                                    "mean")])
    assert torch.allclose(m.predict(dense, as_bags), whole, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="feature 'tags' is missing"):
        m.predict(dense, ids, multi_hot={"items": bags["items"]})
    with pytest.raises(ValueError, match="no multi-hot feature 'genres'"):
        m.predict(dense, ids, multi_hot={**bags, "genres": bags["items"]})
    with pytest.raises(ValueError, match=r"expected \(values, offsets, weights\)"):
        m.predict(dense, ids, multi_hot={**bags, "tags": bags["tags"][:2]})
    with pytest.raises(ValueError, match="offsets must be 58 non-decreasing"):
        m.predict(dense, ids, multi_hot={**bags, "items": (bags["items"][0],
                                                           bags["items"][1][:-1])})
    with pytest.raises(ValueError, match=r"sparse must be \[57, 1\]"):
        m.predict(dense, torch.zeros(n, 3, dtype=torch.long), multi_hot=bags)


def test_the_exported_program_takes_multi_hot_tensors_for_any_batch_and_bag_size():
    m = multi_hot_model()
    program = export_program(multi_hot_model(), "sum-of-rows").module()
    gen = torch.Generator().manual_seed(2)
    for n in (1, 2, 9):
        dense, ids = torch.randn(n, 2, generator=gen), torch.randint(0, 9, (n, 1), generator=gen)
        bags = _random_bags(n, gen)
        # forward takes each bag's lengths, the offsets' differences
        flat = [t.diff() if k == 1 else t for name in ("items", "tags")
                for k, t in enumerate(bags[name])]
        assert torch.allclose(m.predict(dense, ids, multi_hot=bags),
                              torch.sigmoid(m(dense, ids, *flat)))
        with torch.no_grad():
            assert torch.allclose(program(dense, ids, *flat), m(dense, ids, *flat))
    empty = [torch.zeros(0, dtype=torch.long), torch.zeros(3, dtype=torch.long)]  # no ids at all
    with torch.no_grad():
        got = program(torch.ones(3, 2), torch.zeros(3, 1, dtype=torch.long), *empty, *empty,
                      torch.zeros(0))
    assert got.tolist() == [3.0, 3.0, 3.0]  # dense 1 + 1, C1 row 0 (0, 1), empty bags 0


def test_raw_rows_read_by_name_as_the_id_rule_and_the_fold_say():
    """predict(rows): dense columns by name, ids by `raw_ids` (a uint64 past 2^63, its int64
    twin and a string alike), folded as unsigned words; a list column is a multi-hot bag."""
    from shadowsync.data.ids import raw_ids
    from shadowsync.models.trained import SparseFeature

    tables = {"user": torch.arange(6.0).view(3, 2), "site": 10 * torch.arange(10.0).view(5, 2),
              "items": 100 * torch.arange(8.0).view(4, 2)}
    features = [SparseFeature("user"), SparseFeature("site"),
                SparseFeature("items", multi_hot=True)]
    m = TrainedModel(SumOfRows(), tables, num_dense=2, features=features,
                     dense_names=["age", "price"])
    rows = {"click": [1, 0], "price": [0.5, 0.25], "age": [1.0, 2.0],
            "user": [2**64 - 1, -1], "site": ["a.com", "b.org"], "items": [[1, 2**63], []]}
    dense, sparse, bags = m.inputs(rows)
    assert dense.tolist() == [[1.0, 0.5], [2.0, 0.25]] and sparse[:, 0].tolist() == [-1, -1]
    assert (sparse[:, 1] == raw_ids(rows["site"])).all()
    assert bags["items"][0].tolist() == [1, -(2**63)] and bags["items"][1].tolist() == [0, 2, 2]
    site = [int(s) % 5 for s in raw_ids(rows["site"]).view("uint64")]
    # a row r of user / site / items sums to (4r + 1) x 1 / 10 / 100; (2^64 - 1) mod 3 = 0,
    # 1 mod 4 = 1 and 2^63 mod 4 = 0
    expected = torch.tensor([1.5 + 1 + 10 * (4 * site[0] + 1) + 100 * (5 + 1),
                             2.25 + 1 + 10 * (4 * site[1] + 1)])
    logits = m(torch.from_numpy(dense), torch.from_numpy(sparse),
               torch.from_numpy(bags["items"][0]), torch.tensor([2, 0]))
    assert torch.allclose(logits, expected)
    assert torch.equal(m.predict(rows), torch.sigmoid(logits))
    assert m.columns() == ["age", "price", "user", "site", "items"]
    with pytest.raises(ValueError, match="rows: no column 'site'"):
        m.predict({k: v for k, v in rows.items() if k != "site"})
