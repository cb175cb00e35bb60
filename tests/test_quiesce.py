"""The quiescent points of a --val-share job (`shadowsync.train.quiesce`): every worker parked
at a validation point's step with its pushes answered, so that nothing moves between the
validation and the save of the best model."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from shadowsync.train import quiesce
from shadowsync.train.quiesce import DONE, FINISHED, Parking, Quiescence

# How long a push stays in flight before the "server" applies it: worker 0's, and the
# slower pushes of worker 1 (which never flushes, so that some are always in flight).
PUSH_S = (0.05, 0.25)
GATES = [(5, 100), (9, 200)]  # (step, point) at which the fake workers park
STEPS = 11


def pushing_worker(worker: int, parking: Parking, table: torch.Tensor,
                   flush_pushes: bool) -> None:
    """A worker whose every step pushes +1 to its row of `table`, applied PUSH_S later by a
    thread (an asynchronous push to an embedding server, one at a time); it parks at each of
    GATES, flushing its pushes first if `flush_pushes`."""
    server = ThreadPoolExecutor(1)
    pending = []

    def apply() -> None:
        time.sleep(PUSH_S[worker])
        table[worker] += 1

    def flush() -> None:
        for fut in pending:
            fut.result()
        pending.clear()

    gates = list(GATES)
    for step in range(1, STEPS + 1):
        pending.append(server.submit(apply))
        time.sleep(0.005)  # the step's compute
        if gates and step == gates[0][0]:
            parking.park(worker, step, gates.pop(0)[1], flush if flush_pushes else lambda: None,
                         stopping=lambda: False)
    flush()
    parking.finish(worker)


@pytest.mark.timeout(60)
def test_nothing_lands_between_the_validation_and_the_save():
    """Two worker processes park at each gate; trainer 0's side reads the table once the job
    is parked ("validates"), waits two pushes' time ("saves") and reads it again. Worker 0
    parks as the protocol says, worker 1 without its flush (as the old hold did, which waited
    only for the step counts to be quiet): the harness sees its pushes land after the
    validation, and none of worker 0's, at every gate."""
    import torch.multiprocessing as mp

    parking = Parking(2)
    table = torch.zeros(2).share_memory_()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=pushing_worker, args=(w, parking, table, w == 0))
             for w in range(2)]
    for p in procs:
        p.start()
    job = Quiescence(parking, "trainer0", peers=[])
    try:
        for gate, point in GATES:
            end = time.monotonic() + 30
            while (parked := job.parked(gate)) is None and time.monotonic() < end:
                time.sleep(0.002)
            validated = table.clone()
            time.sleep(2 * PUSH_S[1])
            saved = table.clone()
            job.release(point)
            assert parked == {"trainer0": [gate, gate]}  # each at a known step
            assert validated[0] == gate and saved[0] == gate  # every push answered, no more
            assert validated[1] < gate and saved[1] > validated[1]  # without the flush
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert job.parked(STEPS + 1) == {"trainer0": [None, None]}  # both ended
        assert table.tolist() == [STEPS, STEPS]
    finally:
        job.release_all()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


@pytest.mark.timeout(30)
def test_a_worker_parks_at_its_gate_flushed_and_the_wait_is_no_steps_time():
    from shadowsync.train.worker import WorkerRun

    parking = Parking(1)
    order = []
    t0 = time.perf_counter()
    worker = SimpleNamespace(gates=[(3, 96), (3, 100), (5, 160)], steps=3, t_step=t0,
                             spec=SimpleNamespace(parking=parking, worker=0),
                             settle=lambda: order.append(int(parking.parked[0])),
                             stopping=lambda: False)
    threading.Timer(0.2, parking.release, args=(96,)).start()  # an earlier point: still waits
    threading.Timer(0.4, parking.release, args=(100,)).start()
    WorkerRun.park_at_gate(worker)
    waited = time.perf_counter() - t0
    assert order == [-1] and int(parking.parked[0]) == 3  # flushed, then said parked
    assert waited >= 0.4 and worker.gates == [(5, 160)]  # both points of step 3 passed
    assert 0.35 < worker.t_step - t0 <= waited  # the wait is no step's time
    worker.steps = 4
    WorkerRun.park_at_gate(worker)  # no gate at this step: no wait, no flush
    assert order == [-1] and time.perf_counter() - t0 < waited + 0.1
    parking.release(DONE)  # trainer 0 validates no more: every gate is open
    worker.steps = 5
    WorkerRun.park_at_gate(worker)
    assert worker.gates == [] and int(parking.parked[0]) == 5


@pytest.mark.timeout(30)
def test_a_trainer_asked_answers_once_every_worker_is_parked_or_finished():
    parking = Parking(3)
    quiesce.serve_parking(parking)
    try:
        t0 = time.monotonic()
        assert quiesce.parked_here(4, wait_s=0.1) is None  # nobody there yet: "not yet"
        assert time.monotonic() - t0 >= 0.1
        parking.parked[0] = 4
        parking.finish(1)  # a worker whose shard ended: parked at every later gate
        threading.Timer(0.1, parking.parked.__setitem__, args=(2, 4)).start()
        assert quiesce.parked_here(4, wait_s=5) == [4, FINISHED, 4]
        job = Quiescence(parking, "trainer0", peers=[])
        assert job.parked(4) == {"trainer0": [4, None, 4]}
        assert job.parked(5) is None  # the next gate: not there yet
        quiesce.release_here(100)
        parking.release(50)  # a late release of an earlier point: the workers stay released
        assert float(parking.released[0]) == 100
    finally:
        quiesce.serve_parking(None)


@pytest.mark.timeout(30)
def test_a_stopping_worker_leaves_its_parking():
    parking = Parking(1)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    waited = parking.park(0, 7, 100, flush=lambda: None, stopping=stop.is_set)
    assert 0.15 < waited < 5 and int(parking.parked[0]) == 7
