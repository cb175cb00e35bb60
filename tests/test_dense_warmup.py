"""The dense learning-rate warmup, and the failure it prevents: at the default settings,
Adagrad's first full-size steps used to kill every ReLU at the top of the bottom MLP in about
ten steps, and a run whose last one died lost the dense features for good (the default job then
ended about 11% above the teacher in one run of four instead of 4%)."""

import pytest
import torch
import torch.nn.functional as F

from shadowsync.config import TrainConfig
from shadowsync.data.dataset import batches, open_data
from shadowsync.embeddings import EmbeddingTables
from shadowsync.train.trainer import build_dense_model, features_of
from shadowsync.train.worker import lr_warmup, make_dense_optimizer


def test_warmup_rises_linearly_to_the_learning_rate():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = lr_warmup(opt, 4)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    off = torch.optim.SGD([p], lr=0.1)
    lr_warmup(off, 0)
    assert off.param_groups[0]["lr"] == 0.1


def alive_bottom_units(model: torch.nn.Module, dense: torch.Tensor) -> int:
    """Units of the bottom MLP's last ReLU that fire for at least one example."""
    with torch.no_grad():
        return int((model.bottom(dense).max(0).values > 0).sum())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [0, 1])
def test_default_settings_keep_the_bottom_relus_alive(seed):
    # Two optimizers over one model, their steps interleaved: a deterministic stand-in for
    # two Hogwild workers, each of which owns its optimizer state. Without the warmup this
    # left 0 to 4 of the 16 units alive after 60 steps; with it, 14 to 16.
    cfg = TrainConfig(seed=seed, table_size=20_000)
    data = open_data("synthetic", examples=40_000, seed=seed)
    features = features_of(cfg)
    model = build_dense_model(cfg, features)
    tables = EmbeddingTables(list(features.table_rows), cfg.embedding_dim, lr=cfg.lr, seed=seed)
    workers = []
    for w in range(2):
        opt = make_dense_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
        workers.append((opt, lr_warmup(opt, cfg.warmup_steps),
                        batches(data, 0, 32_000, cfg.batch_size, shard=w, num_shards=2,
                                table_size=cfg.table_size)))
    probe = next(batches(data, 32_000, 40_000, 8_000, table_size=cfg.table_size))[0]
    assert alive_bottom_units(model, probe) >= 14
    for _ in range(60):
        for opt, warmup, stream in workers:
            dense, ids, labels = next(stream)
            vectors = tables.lookup(ids).requires_grad_()
            loss = F.binary_cross_entropy_with_logits(model(dense, vectors), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            warmup.step()
            tables.apply_gradients(ids, vectors.grad)
    assert alive_bottom_units(model, probe) >= 12
