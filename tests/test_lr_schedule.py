"""The workers' learning-rate schedule: a dense warmup, and the failure it prevents (at the
default settings, Adagrad's first full-size steps used to kill every ReLU at the top of the
bottom MLP in about ten steps, and a run whose last one died lost the dense features for good:
the default job then ended about 11% above the teacher in one run of four instead of 4%);
then a linear decay of both rates over the end of the pass."""

import pytest
import torch
import torch.nn.functional as F

from shadowsync.config import TrainConfig
from shadowsync.data.dataset import batches, open_data
from shadowsync.embeddings import EmbeddingTables
from shadowsync.train.schedule import LrSchedule
from shadowsync.train.tasks import build_dense_model, features_of
from shadowsync.train.worker import make_dense_optimizer


def test_warmup_rises_linearly_to_the_learning_rate():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = LrSchedule(warmup_steps=4).attach(opt)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    off = torch.optim.SGD([p], lr=0.1)
    LrSchedule(warmup_steps=0).attach(off)
    assert off.param_groups[0]["lr"] == 0.1


def test_decay_falls_linearly_over_the_last_share_to_the_floor():
    s = LrSchedule(decay_share=0.5, decay_floor=0.2, total_steps=10)
    # flat through step 5, then down by 0.8 / 5 a step to 0.2 at the pass's end, held after
    assert [s.decay(k) for k in range(13)] == pytest.approx(
        [1, 1, 1, 1, 1, 1, 0.84, 0.68, 0.52, 0.36, 0.2, 0.2, 0.2])
    assert s.embedding(8) == s.decay(8)
    assert LrSchedule(decay_share=0.5, decay_floor=0.2).decay(100) == 1.0  # no length: no decay
    assert LrSchedule(decay_share=0.0, decay_floor=0.2, total_steps=10).decay(9) == 1.0


def test_dense_rate_is_warmup_times_decay_and_a_resumed_worker_carries_on():
    full = LrSchedule(warmup_steps=3, decay_share=0.5, decay_floor=0.0, total_steps=6)
    p = torch.nn.Parameter(torch.zeros(1))

    def rates(done: int, steps: int) -> list[float]:
        opt = torch.optim.SGD([p], lr=1.0)
        sched = full.attach(opt, done)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    expected = [1 / 3, 2 / 3, 1.0, 1.0, 2 / 3, 1 / 3, 0.0]
    assert rates(0, 7) == pytest.approx(expected)
    assert rates(4, 3) == pytest.approx(expected[4:])


def test_a_config_gives_its_schedule():
    cfg = TrainConfig(warmup_steps=7, lr_decay_share=0.25, lr_decay_floor=0.5)
    assert LrSchedule.of(cfg.optim).over(40) == LrSchedule(7, 0.25, 0.5, 40)
    default = LrSchedule.of(TrainConfig().optim)
    assert (default.decay_share, default.decay_floor) == (0.3, 0.3)


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
    tables = EmbeddingTables(list(features.table_rows), cfg.model.table_width(), lr=cfg.optim.lr,
                             seed=seed)
    workers = []
    for w in range(2):
        opt = make_dense_optimizer(cfg.optim.optimizer, model.parameters(), cfg.optim.lr)
        workers.append((opt, LrSchedule(cfg.optim.warmup_steps).attach(opt),
                        batches(data, 0, 32_000, cfg.optim.batch_size, shard=w, num_shards=2,
                                table_size=cfg.model.table_size)))
    probe = next(batches(data, 32_000, 40_000, 8_000, table_size=cfg.model.table_size))[0]
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


def test_decay_on_a_plateau_starts_where_it_is_told_and_runs_the_same_span():
    s = LrSchedule(decay_share=0.5, decay_floor=0.2, total_steps=10).decaying_from(2)
    # from step 2, down by 0.8 / 5 a step to 0.2 at step 7, held there to the end and past
    assert [s.decay(k) for k in range(12)] == pytest.approx(
        [1, 1, 1, 0.84, 0.68, 0.52, 0.36, 0.2, 0.2, 0.2, 0.2, 0.2])
    assert s.dense(4) == s.embedding(4) == s.decay(4)


def test_the_synthetic_default_job_keeps_its_schedule():
    """`shadowsync train` without options: no decay on a plateau (it validates nothing), the
    decay over the last 30% of the one pass as before."""
    cfg = TrainConfig().adapted()  # as the job resolves it
    assert (cfg.data.epochs, cfg.data.val_share, cfg.optim.lr_decay_on_plateau) == (1, 0.0, False)
    assert LrSchedule.of(cfg.optim).over(5000) == LrSchedule(300, 0.3, 0.3, 5000)
    assert LrSchedule.of(cfg.optim).over(5000).decay_start is None
