"""Hogwild workers start from the fork server, or spawned where a request cannot carry them."""

from __future__ import annotations

import pytest
import torch

from shadowsync import forkserver


def _sum_into(tensors: list[torch.Tensor], results) -> None:
    tensors[0].add_(1.0)  # shared: the parent sees it
    results.put(float(sum(float(t.sum()) for t in tensors)))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("count", [8, 300])
def test_a_worker_gets_its_shared_tensors_forked_or_spawned(count):
    """8 shared tensors fit one request to the fork server; 300 (a model with that many
    parameters) exceed the file descriptors one request carries, and the worker is spawned."""
    forkserver.start()
    ctx = forkserver.worker_context()  # this process runs the server: its own context
    assert ctx.get_start_method() == "forkserver"
    tensors = [torch.full((3,), float(i)).share_memory_() for i in range(count)]
    results = ctx.Queue()
    p = forkserver.start_worker(ctx, _sum_into, (tensors, results))
    try:
        assert results.get(timeout=120) == 3 * (sum(range(count)) + 1)
        p.join(timeout=30)
        assert p.exitcode == 0
        assert tensors[0].tolist() == [1.0, 1.0, 1.0]
        assert type(p).__name__ == ("ForkServerProcess" if count == 8 else "SpawnProcess")
    finally:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)


def test_a_child_whose_request_never_arrived_ends_quietly():
    """A child of the fork server reads EOF where its sender was stopped mid-request: it
    ends with exit code 1 and no traceback; anything else is multiprocessing's as before."""
    from shadowsync.forkserver import quiet_when_unsent

    def cut_short(fd: int, sentinel: int) -> int:
        raise EOFError("Ran out of input")

    def fails(fd: int, sentinel: int) -> int:
        raise ValueError("not an unsent request")

    assert quiet_when_unsent(cut_short)(3, 4) == 1
    assert quiet_when_unsent(lambda fd, sentinel: fd + sentinel)(3, 4) == 7
    with pytest.raises(ValueError, match="not an unsent request"):
        quiet_when_unsent(fails)(3, 4)


def test_a_request_cut_short_is_an_aborted_connection_the_servers_loop_passes_over():
    import errno
    import socket

    from shadowsync.forkserver import RECVFDS, aborted_when_cut_short

    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        right.close()  # the sender stopped before it sent anything
        with pytest.raises(EOFError):
            RECVFDS(left, 4)
        with pytest.raises(ConnectionAbortedError) as cut:
            aborted_when_cut_short(RECVFDS)(left, 4)
    assert cut.value.errno == errno.ECONNABORTED  # what multiprocessing's loop skips
