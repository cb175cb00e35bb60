"""The plain-PyTorch model `shadowsync.load` returns, on small hand-made tables: lookups are the
rows asked for (ids modulo the table size), `predict` batches without changing a number, and
an export that torch.export cannot trace is one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from shadowsync.errors import UserError
from shadowsync.inference import export_program
from shadowsync.models.trained import TrainedModel


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
