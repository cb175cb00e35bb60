"""The state a protocol mode checkpoints on its dense servers (parameters, momentum, version,
progress, the protocol decided, the switch schedule's detector windows) round-trips: a server
restored from it continues exactly as the original does."""

from __future__ import annotations

import torch

from shadowsync.runners.switch.detector import DetectorConfig
from shadowsync.runners.switch.machine import SwitchMachine
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.spec.plan import SwitchPlan
from shadowsync.transport.servers.dense import DenseServer, Push


def schedule() -> Schedule:
    return Schedule(SwitchPlan.parse("bsp:0.5,asp"), budget=400, policy="greedy",
                    detector=DetectorConfig(k=1.5, m=2, window=5))


def new_server(state=None) -> DenseServer:
    server = DenseServer()
    if state is not None:
        server.load_state_dict(state)
    server.init_trained("w", torch.tensor([0.5, -1.0, 2.0]), "sgd", SwitchMachine(workers=2,
                        schedule=schedule(), budget=400))
    server.init("centre", torch.zeros(2))  # a plain tensor beside it (the EASGD centre)
    return server


def step(server: DenseServer, k: int) -> list:
    """One step of two workers, trainer 1 3x slower for steps 10..29 (the detector sees it)."""
    mode, phase = server.mode("w")
    version = server.params("w")[1]
    futs = []
    for t in range(2):
        grad = torch.tensor([1.0 + t, -0.5 * k, 0.1 * t * k])
        futs.append(server.push("w", grad, Push(mode, version, phase, 0.05, 0.9, False, t,
                                                0.03 if t == 1 and 10 <= k < 30 else 0.01)))
    return [f.wait() for f in futs]


def test_a_dense_server_restored_from_its_checkpoint_continues_exactly():
    a = new_server()
    for k in range(17):  # into the straggler: one slow window of two, momentum built
        step(a, k)
    a.add("centre", torch.tensor([1.0, 2.0]))
    saved = {key: value.clone() for key, value in a.state_dict().items()}
    assert int(saved["trained/w/applied"]) == 34 and saved["trained/w/slot"].abs().sum() > 0
    b = new_server(saved)
    assert torch.equal(b.get("centre"), torch.tensor([1.0, 2.0]))
    assert b.mode("w") == a.mode("w")
    detector = a.trained["w"].machine.schedule.detector
    # 17 steps of trainer 0 closed 3 windows; the first had no window of trainer 1 to compare
    assert detector.tracks[0].windows == 2
    # every window, flag and count (elastic's false-alarm rate) as the original's
    assert b.trained["w"].machine.schedule.detector.tracks == detector.tracks
    modes = set()
    for k in range(17, 60):
        ra, rb = step(a, k), step(b, k)
        for x, y in zip(ra, rb, strict=True):
            assert torch.equal(x.params, y.params)
            assert (x.version, x.applied, x.mode, x.phase) == (y.version, y.applied, y.mode,
                                                                y.phase)
        modes.add(ra[0].mode)
    assert modes == {"bsp", "asp"}  # the greedy policy switched on the restored server too


def test_a_resumed_server_counts_progress_from_the_workers_positions():
    """A checkpoint taken while training may hold a few pushes past the workers' positions;
    they are pushed again after a resume, so progress (and BSP's share) rewinds to them."""
    a = new_server()
    for k in range(10):  # BSP steps of two workers: 20 gradients applied
        step(a, k)
    saved = {key: value.clone() for key, value in a.state_dict().items()}
    b = DenseServer()
    b.load_state_dict(saved)
    b.rewind(2 * 7)  # the positions said 7 steps each
    b.init_trained("w", torch.zeros(3), "sgd",
                   SwitchMachine(workers=2, schedule=schedule(), budget=400))
    assert (b.trained["w"].machine.applied, b.trained["w"].machine.bsp_applied) == (14, 14)
    assert torch.equal(b.params("w")[0], a.params("w")[0])  # the state itself is kept
    c = DenseServer()
    c.load_state_dict(saved)
    c.rewind(30)  # never forward
    c.init_trained("w", torch.zeros(3), "sgd",
                   SwitchMachine(workers=2, schedule=schedule(), budget=400))
    assert c.trained["w"].machine.applied == 20
