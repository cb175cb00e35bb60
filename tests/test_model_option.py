"""--model MODULE:FUNCTION: the user's dense model, or one clear line saying what is wrong."""

from __future__ import annotations

import re

import pytest
import torch

from shadowsync.config import TrainConfig
from shadowsync.errors import UserError
from shadowsync.models import DLRMDense, build_model
from tests.helpers import TwoLayerMLP, two_layer_mlp


def wrong_shape(num_dense, num_tables, embedding_dim):
    return torch.nn.Linear(num_dense, 1)  # forward(dense, emb) fails: two inputs


def column(num_dense, num_tables, embedding_dim):
    class Column(torch.nn.Module):
        def forward(self, dense, emb):
            return dense[:, :1]  # [B, 1], not [B]

    return Column()


def test_dlrm_is_the_default_and_sized_by_the_data():
    m = build_model("dlrm", 4, 7, 8, [16], [16])
    assert isinstance(m, DLRMDense)
    assert m(torch.zeros(3, 4), torch.zeros(3, 7, 8)).shape == (3,)


def test_a_module_path_and_a_callable_build_the_same_model():
    by_name = build_model("tests.helpers:two_layer_mlp", 5, 3, 4, [], [])
    by_callable = build_model(two_layer_mlp, 5, 3, 4, [], [])
    assert isinstance(by_name, TwoLayerMLP) and isinstance(by_callable, TwoLayerMLP)


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:f", "--model no_such_module_xyz:f: cannot import module"),
    ("tests.helpers:nope", "--model tests.helpers:nope: module 'tests.helpers' has no 'nope'"),
    ("tests.test_model_option:wrong_shape", "forward(dense [2, 5], emb [2, 3, 4]) failed"),
    ("tests.test_model_option:column", "forward must return logits of shape [B] = [2], got [2, 1]"),
    ("just_a_name", "must be dlrm or MODULE:FUNCTION"),
])
def test_model_mistakes_are_one_line(spec, message):
    with pytest.raises(UserError, match=re.escape(message)) as e:
        build_model(spec, 5, 3, 4, [], [])
    assert "\n" not in str(e.value)


def test_a_factory_that_cannot_travel_to_other_processes_is_refused():
    with pytest.raises(UserError, match="cannot be sent to other processes"):
        TrainConfig(model=lambda d, t, e: None)
