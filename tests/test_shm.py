"""Files under /dev/shm: a process killed before it could unlink its tables' files leaves
them behind; the launcher removes those of the job's processes that are gone, and no other."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from shadowsync.transport import shm

MAKE_AND_HANG = """
import sys, time, torch
from shadowsync.transport import shm
path = shm.new_path("emb0-weight")
shm.to_shared_file(torch.ones(4, 3), path)
print(path, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not shm.available(), reason="no writable /dev/shm")
@pytest.mark.timeout(60)
def test_files_of_a_killed_process_are_removed_and_no_others():
    mine = shm.new_path("live")
    shm.to_shared_file(torch.zeros(2), mine)
    proc = subprocess.Popen([sys.executable, "-c", MAKE_AND_HANG], stdout=subprocess.PIPE,
                            text=True)
    try:
        left = proc.stdout.readline().strip()
        assert os.path.exists(left) and left.startswith(f"/dev/shm/shadowsync-{proc.pid}-")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert os.path.exists(left)  # a killed process unlinks nothing
        assert shm.remove_left_by([proc.pid]) == [left]
        assert not os.path.exists(left) and os.path.exists(mine)  # this process's stays
        assert shm.remove_left_by([proc.pid]) == []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shm.unlink(mine)
