"""The running average of a --val-share job's epoch ends (--weight-average-from): the rule
against its closed form, each process's part of it put in the model's place and back, what
trainer 0's validations keep, and the option's defaults."""

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from shadowsync.checkpoint import shards
from shadowsync.config import TrainConfig
from shadowsync.embeddings import EmbeddingTables
from shadowsync.errors import UserError
from shadowsync.rules.average import RunningAverage, fold_into_mean
from shadowsync.train.notices import JobNotices, Notices
from shadowsync.train.selection import ModelSelection
from shadowsync.train.state import DenseModelState, RngState
from shadowsync.train.validation import Validation


def test_folding_n_snapshots_gives_their_arithmetic_mean():
    torch.manual_seed(0)
    snapshots = [{"w": torch.randn(3, 4), "b": torch.randn(4)} for _ in range(5)]
    average = RunningAverage()
    for n, snap in enumerate(snapshots, start=1):
        average.fold(snap)
        assert average.count == n
        for key in ("w", "b"):  # m_n = (x_1 + ... + x_n) / n after every fold
            expected = torch.stack([s[key] for s in snapshots[:n]]).mean(0)
            torch.testing.assert_close(average.mean[key], expected)
    assert snapshots[0]["w"] is not average.mean["w"]  # the first snapshot was copied


def test_one_fold_is_the_closed_form_step():
    mean = torch.tensor([2.0, -4.0])
    fold_into_mean(mean, torch.tensor([6.0, 8.0]), count=4)  # 2 + (6 - 2) / 4, -4 + 12 / 4
    assert torch.equal(mean, torch.tensor([3.0, -1.0]))


def test_two_exchanges_give_back_the_model_and_the_average():
    average = RunningAverage()
    average.fold({"w": torch.tensor([1.0, 3.0])})
    average.fold({"w": torch.tensor([3.0, 5.0])})
    live = {"w": torch.tensor([9.0, 9.0])}
    put = average.exchange(live)
    assert torch.equal(put["w"], torch.tensor([2.0, 4.0]))
    back = average.exchange(put)
    assert torch.equal(back["w"], torch.tensor([9.0, 9.0]))
    assert torch.equal(average.mean["w"], torch.tensor([2.0, 4.0]))


@pytest.fixture
def shard():
    """Trainer 0's shard with a dense model, its own tables (weights and Adagrad state) and
    its random state, registered for checkpoints as a run registers them."""
    model = torch.nn.Linear(2, 1)
    tables = EmbeddingTables([3, 2], dim=2, lr=0.1, seed=0)
    shards.clear()
    shards.register("trainer0", "model", DenseModelState(model))
    shards.register("trainer0", "tables", tables)
    shards.register("trainer0", "rng", RngState())
    yield model, tables
    shards.clear()


def _set(model, tables, value: float) -> None:
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(-value)
        tables.weight.fill_(10 * value)
        tables.state.fill_(100 * value)  # optimizer state: never averaged nor swapped


def test_a_process_swaps_its_model_and_its_average_of_the_epoch_ends(shard):
    model, tables = shard
    for value in (1.0, 2.0, 6.0):  # three epoch ends
        _set(model, tables, value)
        count = shards.fold_average_here()
    assert count == 3
    _set(model, tables, 7.0)  # trained on since
    shards.swap_average_here()
    assert torch.equal(model.weight, torch.full((1, 2), 3.0))  # (1 + 2 + 6) / 3
    assert torch.equal(model.bias, torch.full((1,), -3.0))
    assert torch.equal(tables.weight, torch.full_like(tables.weight, 30.0))
    assert torch.equal(tables.state, torch.full_like(tables.state, 700.0))  # the live state
    shards.swap_average_here()
    assert torch.equal(model.weight, torch.full((1, 2), 7.0))  # back as it was
    assert torch.equal(tables.weight, torch.full_like(tables.weight, 70.0))
    _set(model, tables, 11.0)  # one more epoch end folds into the average, not the 7s
    assert shards.fold_average_here() == 4
    shards.swap_average_here()
    assert torch.equal(model.weight, torch.full((1, 2), 5.0))  # (1 + 2 + 6 + 11) / 4


class _Checkpointer:
    """Trainer 0's checkpointer as a validation sees it: an average of the live model's
    scores stands for the average of its weights."""

    def __init__(self, live):
        self.live, self.folded, self.swapped, self.saved = live, [], False, []

    def fold_average(self) -> int:
        self.folded.append(self.live["ne"])
        return len(self.folded)

    @contextmanager
    def average_in_place(self):
        self.swapped = True
        try:
            yield
        finally:
            self.swapped = False

    def save_best(self, best):
        self.saved.append((dict(best), self.swapped))
        return Path("best")


class _Progress:
    def __init__(self):
        self.rows = []

    def wall(self) -> float:
        return 0.0

    def row(self, wall):
        return {}

    def write(self, row):
        self.rows.append(row)


def _validation(live, average_ne, tmp_path, average_from=2):
    """Trainer 0's validations of one trainer over 100-row epochs; `live` is the model's
    score now, and the average, when in place, scores `average_ne(count)`."""
    checkpointer = _Checkpointer(live)

    def score():
        if checkpointer.swapped:
            ne = average_ne(len(checkpointer.folded))
            return {"ne": ne, "auc": 1 - ne}
        return {"ne": live["ne"], "auc": 1 - live["ne"]}

    validation = Validation(score, "ne", ModelSelection(False, patience=None), job=None,
                            notices=JobNotices(Notices(), peers=[], out=tmp_path),
                            trained_now=lambda: live["at"], trainers=1, epoch_rows=100,
                            sync=None, checkpointer=checkpointer, progress=_Progress(),
                            average_from=average_from)
    return validation, checkpointer


def test_the_average_of_the_epoch_ends_is_kept_where_it_validates_better(tmp_path):
    live = {}
    validation, checkpointer = _validation(live, {2: 0.80, 3: 0.78}.get, tmp_path)
    points = [50, 100, 150, 200, 250, 300, 350, 400]
    scores = [0.90, 0.82, 0.85, 0.79, 0.83, 0.80, 0.86, 0.81]
    for point, ne in zip(points, scores, strict=True):
        live.update(at=point, ne=ne)
        validation.validate(point=point)
    # folded at the ends of epochs 2, 3 and 4 only
    assert checkpointer.folded == [0.79, 0.80, 0.81]
    # the model trained is kept at each of its own bests; the average of 3 beats them all
    assert [(b["epoch"], b.get("averaged"), swapped) for b, swapped in checkpointer.saved] == [
        (0.5, None, False), (1.0, None, False), (2.0, None, False), (4.0, 3, True)]
    assert validation.kept == 0.78 and validation.kept_at["averaged"] == 3
    assert validation.kept_at["val_auc"] == pytest.approx(0.22)
    # the average of 2 (0.80) did not beat the 0.79 kept, and the model trained decides the
    # decay and the stop: 4 validations without improvement since its best at epoch 2
    assert validation.selection.best == 0.79 and validation.selection.since_best == 4
    rows = validation.progress.rows
    assert [r.get("average_val_ne") for r in rows] == [None] * 5 + [0.80, None, 0.78]


def test_without_weight_average_from_nothing_is_folded(tmp_path):
    live = {}
    validation, checkpointer = _validation(live, lambda n: 0.0, tmp_path, average_from=0)
    for point, ne in ((100, 0.8), (200, 0.7), (300, 0.75)):
        live.update(at=point, ne=ne)
        validation.validate(point=point)
    assert checkpointer.folded == []
    assert validation.kept == 0.7 and "averaged" not in validation.kept_at


def test_val_share_averages_from_the_end_of_epoch_3_where_the_model_can_be_averaged():
    assert TrainConfig(val_share=0.1).adapted().data.weight_average_from == 3
    assert TrainConfig().adapted().data.weight_average_from == 0  # the synthetic job
    # dense servers train the model a bsp run keeps; dynamic tables move ids between rows
    assert TrainConfig(val_share=0.1, sync="bsp").adapted().data.weight_average_from == 0
    assert TrainConfig(val_share=0.1, tables="dynamic").adapted().data.weight_average_from == 0
    assert TrainConfig(val_share=0.1, weight_average_from=0).adapted() \
        .data.weight_average_from == 0
    assert TrainConfig(val_share=0.1, weight_average_from=5).adapted() \
        .data.weight_average_from == 5


@pytest.mark.parametrize("options, message", [
    ({"weight_average_from": 2}, "--weight-average-from needs --val-share"),
    ({"weight_average_from": -1, "val_share": 0.1}, "--weight-average-from must be >= 0"),
    ({"weight_average_from": 2, "val_share": 0.1, "sync": "asp"}, "--sync asp"),
    ({"weight_average_from": 2, "val_share": 0.1, "tables": "dynamic"}, "dynamic tables"),
])
def test_an_average_it_cannot_keep_is_an_error(options, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(**options)
