"""--model MODULE:FUNCTION: the user's dense model, or one clear line saying what is wrong."""

from __future__ import annotations

import re

import pytest
import torch

from shadowsync.config import ModelConfig, TrainConfig
from shadowsync.errors import UserError
from shadowsync.models import DLRMDense, build_model
from tests.helpers import TwoLayerMLP, two_layer_mlp


def dlrm_shape(dim, bottom, top, id_bias=False):
    return ModelConfig("dlrm", dim, bottom_mlp=bottom, top_mlp=top, id_bias=id_bias)


def wrong_shape(num_dense, num_tables, embedding_dim):
    return torch.nn.Linear(num_dense, 1)  # forward(dense, emb) fails: two inputs


def column(num_dense, num_tables, embedding_dim):
    class Column(torch.nn.Module):
        def forward(self, dense, emb):
            return dense[:, :1]  # [B, 1], not [B]

    return Column()


def test_dlrm_is_the_default_and_sized_by_the_data():
    m = build_model(dlrm_shape(8, [16], [16]), 4, 7)
    assert isinstance(m, DLRMDense)
    assert m(torch.zeros(3, 4), torch.zeros(3, 7, 8)).shape == (3,)


def pair_by_pair_dots(x, emb):
    """<f_i, f_j> for every pair i < j of [x, emb[:, 0], emb[:, 1], ...], written out."""
    feats = [x, *emb.unbind(1)]
    return torch.stack([(f * g).sum(1) for i, f in enumerate(feats) for g in feats[i + 1:]], 1)


def test_dlrm_interaction_is_every_pair_of_features_dotted_once():
    """The top MLP sees the bottom output and, for every pair i < j of the features (bottom
    output first, then each table's embedding), their dot product: the DLRM paper's form,
    written here pair by pair; its gradient reaches the embeddings the same way."""
    torch.manual_seed(0)
    m = build_model(dlrm_shape(3, [8], [8]), 4, 5)
    dense, emb = torch.randn(6, 4), torch.randn(6, 5, 3, requires_grad=True)
    seen = []
    m.top.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    m(dense, emb).sum().backward()
    x = m.bottom(dense)
    expected = torch.cat([x, pair_by_pair_dots(x, emb)], 1)
    torch.testing.assert_close(seen[0], expected)
    grad = emb.grad.clone()
    emb.grad = None
    m.top(expected).sum().backward()
    torch.testing.assert_close(emb.grad, grad)


def test_dot_cat_shows_the_top_mlp_the_embeddings_beside_their_dot_products():
    """With "dot+cat" the top MLP reads [x, dots, every embedding flattened]. Rotating every
    embedding by one orthogonal matrix, with the bottom output at zero, keeps every dot
    product: the "dot" model cannot tell the two inputs apart, "dot+cat" must."""
    torch.manual_seed(0)
    dot = build_model(dlrm_shape(3, [8], [8]), 4, 5)
    cat = build_model(ModelConfig("dlrm", 3, bottom_mlp=[8], top_mlp=[8], id_bias=False,
                                  interaction="dot+cat"), 4, 5)
    dense, emb = torch.randn(6, 4), torch.randn(6, 5, 3)
    seen = []
    cat.top.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    cat(dense, emb)
    x = cat.bottom(dense)
    torch.testing.assert_close(seen[0], torch.cat([x, pair_by_pair_dots(x, emb), emb.flatten(1)],
                                                  1))

    q, _ = torch.linalg.qr(torch.randn(3, 3))
    for m in (dot, cat):
        torch.nn.init.zeros_(m.bottom[-2].weight)
        torch.nn.init.zeros_(m.bottom[-2].bias)  # x = relu(0) = 0
    rotated = emb @ q
    torch.testing.assert_close(dot(dense, rotated), dot(dense, emb))
    assert (cat(dense, rotated) - cat(dense, emb)).abs().max() > 1e-3


def test_the_id_bias_is_the_last_column_summed_into_the_logit():
    """With the id bias an embedded row is one column wider: the DLRM sees the first
    `embedding_dim` columns, and the last column of every table's row is added to the logit,
    so its gradient is the logit's, once per table."""
    torch.manual_seed(0)
    plain = build_model(dlrm_shape(3, [8], [8]), 4, 5)
    with_bias = build_model(dlrm_shape(3, [8], [8], id_bias=True), 4, 5)
    with_bias.load_state_dict(plain.state_dict())  # the bias adds no dense parameter
    dense, emb = torch.randn(6, 4), torch.randn(6, 5, 4, requires_grad=True)
    logits = with_bias(dense, emb)
    torch.testing.assert_close(logits, plain(dense, emb[..., :3]) + emb[..., 3].sum(1))
    (logits * torch.arange(6.0)).sum().backward()
    torch.testing.assert_close(emb.grad[..., 3], torch.arange(6.0)[:, None].expand(6, 5))


@pytest.mark.parametrize("kw, width", [
    ({}, 17), ({"id_bias": False}, 16), ({"model": "tests.helpers:two_layer_mlp"}, 16),
])
def test_the_tables_are_as_wide_as_the_model_reads(kw, width):
    assert TrainConfig(**kw).model.table_width() == width


def test_a_module_path_and_a_callable_build_the_same_model():
    by_name = build_model(ModelConfig("tests.helpers:two_layer_mlp", 4), 5, 3)
    by_callable = build_model(ModelConfig(two_layer_mlp, 4), 5, 3)
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
        build_model(ModelConfig(spec, 4), 5, 3)
    assert "\n" not in str(e.value)


def test_a_factory_that_cannot_travel_to_other_processes_is_refused():
    import pickle
    import threading

    lock = threading.Lock()
    with pytest.raises(UserError, match="cannot be sent to other processes"):
        TrainConfig(model=lambda d, t, e: lock)
    # A lambda alone travels by value (cloudpickle), as a notebook's factory does.
    cfg = pickle.loads(pickle.dumps(TrainConfig(model=lambda d, t, e: (d, t, e))))
    assert cfg.model.name(1, 2, 3) == (1, 2, 3)
