"""The one line an unexpected failure is reported with (`errors.failure_line`)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from shadowsync.errors import failure_line
from tests.helpers import run_spawned


def test_a_local_failure_is_its_type_and_first_line():
    assert failure_line(ValueError("bad shape\nmore detail")) == "ValueError: bad shape"
    assert failure_line(KeyError("emb0")) == "KeyError: 'emb0'"
    assert failure_line(RuntimeError()) == "RuntimeError"


def _raise_there() -> None:
    raise KeyError("no such shard")


def _remote_failure(port: int, queue: mp.Queue) -> None:
    import torch.distributed.rpc as rpc

    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                           _transports=["uv"])
    rpc.init_rpc("emb0", rank=0, world_size=1, rpc_backend_options=opts)
    try:
        rpc.rpc_sync("emb0", _raise_there)
    except Exception as e:  # noqa: BLE001 - what the test reads
        queue.put(failure_line(e))
    rpc.shutdown()


@pytest.mark.timeout(60)
def test_a_failure_raised_by_a_remote_function_names_the_process_and_its_exception():
    """torch RPC re-raises a remote function's exception with the remote traceback as its
    message, whose last line says nothing; the line names where it failed and what."""
    from shadowsync.cluster.launch import free_port

    [line] = run_spawned([(_remote_failure, (free_port("127.0.0.1"),))], 1, timeout=50)
    assert line == "on emb0: KeyError('no such shard')"


def test_a_remote_failure_worded_with_real_newlines_reads_the_same():
    text = ("On WorkerInfo(id=2, name=trainer1):\nValueError('bad shard')\nTraceback (most "
            "recent call last):\n  File \"x.py\", line 1, in f\nValueError: bad shard\n")
    assert failure_line(RuntimeError(text)) == "on trainer1: ValueError('bad shard')"
