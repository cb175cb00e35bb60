"""Background sync stepping aside for a straggler (`--straggler-fallback s-easgd`): the policy
on scripted paces, the runner's moves on plain tensors, and one real short run."""

import json

import pytest
import torch

from shadowsync.rules import make_rule
from shadowsync.runners.fallback import SLOTS, FallbackSync
from shadowsync.runners.groups import ParamGroup
from shadowsync.runners.shadow import Pace
from shadowsync.runners.switch.background import BackgroundFallback
from shadowsync.runners.switch.detector import DetectorConfig
from shadowsync.spec.interval import SyncInterval

# two trainers, one step-time mean each per round; trainer 1 is 3x slower in rounds 5-8
SCRIPT = [[[1.0], [1.0]]] * 5 + [[[1.0], [3.0]]] * 4 + [[[1.0], [1.0]]] * 5


def test_policy_moves_to_easgd_after_m_slow_windows_and_back_after_m_normal():
    p = BackgroundFallback("ma", DetectorConfig(k=1.5, m=3, window=8))
    rules = [p.decide(paces) for paces in SCRIPT]
    assert rules == ["ma"] * 7 + ["easgd"] * 4 + ["ma"] * 3
    # a round where nobody has anything new changes nothing
    assert p.decide([[0.0], [0.0]]) == "ma"
    # several windows in one round count one by one
    assert p.decide([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]]) == "easgd"
    # noise of +-30% is never a straggler
    q = BackgroundFallback("bmuf")
    assert {q.decide([[1.0], [1.0 + 0.3 * (-1) ** i]]) for i in range(30)} == {"bmuf"}


def test_step_times_are_shared_as_window_means_and_the_rest_waits():
    p = BackgroundFallback("ma", DetectorConfig(window=2))
    means, rest = p.chunks([1.0, 3.0, 2.0, 2.0, 5.0], slots=3)
    assert means == [2.0, 2.0, 0.0] and rest == [5.0]
    means, rest = p.chunks([1.0] * 9, slots=3)
    assert means == [1.0] * 3 and rest == [1.0] * 3


class FakeExchange:
    """One trainer's view: the other trainer always holds `other`; the centre is local."""

    index = 0
    bytes_sent = 0
    dtype = "fp32"

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other
        self.script = iter(SCRIPT)
        self.centre_value: torch.Tensor | None = None

    def gather(self, values: list[float]) -> list[float]:
        assert len(values) == SLOTS
        return [v for mine in next(self.script) for v in mine + [0.0] * (SLOTS - 1)]

    def begin_round(self, done: bool) -> None:
        pass

    def end_round(self) -> bool:
        return False

    def mean(self, local: torch.Tensor) -> torch.Tensor:
        return (local + self.other) / 2

    def every_trainer_done(self) -> bool:
        return False

    def init_centre(self, name: str, value: torch.Tensor) -> None:
        self.centre_value = value.clone()

    def use_centre(self, name: str) -> None:
        pass

    def centre(self) -> torch.Tensor:
        return self.centre_value.clone()

    def add_to_centre(self, delta: torch.Tensor) -> None:
        self.centre_value += delta


def test_runner_seeds_the_centre_with_the_average_and_restarts_bmuf_from_it():
    param = torch.zeros(3)
    ex = FakeExchange(other=torch.full((3,), 4.0))
    bmuf = make_rule("bmuf", trainers=2)
    group = ParamGroup("dense", [param], bmuf)
    runner = FallbackSync([group], ex, Pace(SyncInterval(0.0), 0.1),
                          {"dense": make_rule("easgd", alpha=0.5)},
                          BackgroundFallback("bmuf"), ("s-bmuf", "s-easgd"))
    bmuf.start(group.flat())
    ex.init_centre("dense", group.flat())
    for _ in range(8):  # BMUF rounds; the 8th sees the 3rd slow report in a row: moves
        param.add_(1.0)  # the workers' progress between rounds
        runner.run_round(False)
    assert [m["to"] for m in runner.moves] == ["s-easgd"]
    assert runner.moves[0]["stragglers"] == [1]
    # the moving round averaged: local and centre both hold the mean with the other trainer
    assert torch.equal(ex.centre_value, param) and group.rule.name == "easgd"
    # a checkpoint taken now still has what BMUF loads on resume
    assert set(runner.state_dict()) == {"dense.global_model", "dense.block_momentum",
                                        "dense.rounds"}
    before = param.clone()
    param.add_(2.0)
    runner.run_round(False)  # EASGD: both move halfway towards each other, sum conserved
    assert torch.allclose(param, before + 1.0) and torch.allclose(ex.centre_value, before + 1.0)
    for _ in range(3):
        runner.run_round(False)
    assert [m["to"] for m in runner.moves] == ["s-easgd", "s-bmuf"]
    assert group.rule is bmuf and torch.equal(bmuf.global_model, param)
    assert torch.equal(bmuf.delta, torch.zeros(3))  # block momentum starts over
    assert bmuf.rounds == 0  # and warms up again


def test_fallback_option_mistakes_are_one_line_errors(capsys):
    from shadowsync.cli import main

    assert main(["train", "--sync", "s-easgd", "--straggler-fallback", "s-easgd"]) == 2
    assert "--straggler-fallback needs --sync s-ma or s-bmuf" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_a_real_run_moves_to_easgd_under_a_straggler_and_back(tmp_path):
    from shadowsync.api import run
    from shadowsync.config import TrainConfig

    cfg = TrainConfig(task="digits", trainers=2, workers=1, embedding_servers=1,
                      examples=64_000, batch_size=16, optimizer="sgd", lr=0.05,
                      warmup_steps=0, sync="s-ma", sync_interval="0.02",
                      straggler_fallback="s-easgd", switch_detector="k=2,m=3,window=8",
                      straggler="trainer=1,slowdown=3,start=1,duration=3",
                      eval_points=2, progress=False, out=str(tmp_path / "run")).validate()
    # Long enough that the job outlasts the straggler's 4 s window plus the detector's lag on
    # a fast idle machine (16,000 examples once ended 1 s after the move back; 32,000 trained
    # for 3.3-4.0 s and sometimes ended before it).
    _, summary = run(cfg)
    moves = summary["sync_moves"]
    assert [m["to"] for m in moves][:2] == ["s-easgd", "s-ma"], moves
    assert moves[0]["stragglers"] == [1]
    assert summary["eval_accuracy"] > 0.8
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["sync_moves"] == moves
