"""Tensors in files under /dev/shm that unrelated processes on one host map (no copies).

A process started by the launcher is not a child of another, so `share_memory_()` handles
cannot reach it; a named file mapped with `torch.from_file(path, shared=True)` can. Whether
two processes are on the same host is decided by `host_id()`: the host name, the boot and the
network namespace (emulated hosts in network namespaces share one file system but count as
different hosts, so they keep talking over the network as real hosts would).
"""

from __future__ import annotations

import glob
import math
import os
import socket
import uuid
from collections.abc import Iterable

import torch

SHM_DIR = "/dev/shm"


def host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return f"{socket.gethostname()}:{os.getpid()}"  # unknown: match only this process
    return f"{socket.gethostname()}:{boot}:{netns}"


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def free_bytes() -> int:
    """Bytes that can still be placed in /dev/shm (what `df` shows as available)."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def shortfall(needed: int, host: str) -> str | None:
    """None when /dev/shm has room for `needed` more bytes; else the one line that says how
    much is needed and free on `host`, and how to give /dev/shm more room.

    A mapping larger than the tmpfs behind /dev/shm does not fail when it is made: it ends
    the process with SIGBUS at the first page that does not fit, so room is checked first.
    The size suggested is the tmpfs's size as it would have to be, rounded up to a power of
    two MiB (Docker's and Kubernetes' default is 64 MiB)."""
    free = free_bytes()
    if needed <= free:
        return None
    st = os.statvfs(SHM_DIR)
    used = (st.f_blocks - st.f_bavail) * st.f_frsize
    size = f"{1 << max(6, math.ceil(math.log2((used + needed) / 2**20)))}m"
    return (f"{SHM_DIR} on {host} is too small for this job: its processes there need "
            f"{needed:,} bytes of shared memory and {free:,} are free; give it at least {size} "
            f"(docker run --shm-size={size}, or on Kubernetes an emptyDir with medium: Memory "
            f"mounted on {SHM_DIR})")


def _prefix(pid: int) -> str:
    """The start of every file process `pid` makes here: its PID names what it leaves."""
    return os.path.join(SHM_DIR, f"shadowsync-{pid}-")


def new_path(label: str) -> str:
    return f"{_prefix(os.getpid())}{uuid.uuid4().hex[:8]}-{label}"


def to_shared_file(tensor: torch.Tensor, path: str) -> torch.Tensor:
    """A copy of `tensor` (of its dtype) backed by a new file at `path`."""
    mapped = map_file(path, tuple(tensor.shape), create=True, dtype=tensor.dtype)
    mapped.copy_(tensor)
    return mapped


def map_file(path: str, shape: tuple[int, ...], create: bool = False,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Map the file at `path` as a tensor of `shape` and `dtype`; writes go to every mapper."""
    n = 1
    for s in shape:
        n *= s
    size = n * dtype.itemsize
    if not create and os.path.getsize(path) != size:
        raise ValueError(f"{path}: {os.path.getsize(path)} bytes, expected {size}")
    return torch.from_file(path, shared=True, size=n, dtype=dtype).view(*shape)


def unlink(path: str) -> None:
    """Remove the name; mappings already made stay valid until their processes let go."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_left_by(pids: Iterable[int]) -> list[str]:
    """Remove the files that processes `pids`, which are gone, made and did not unlink (one
    killed before every peer had mapped its tables), so that they stop holding memory.
    Returns their paths."""
    removed = []
    for pid in pids:
        for path in glob.glob(f"{glob.escape(_prefix(pid))}*"):
            unlink(path)
            removed.append(path)
    return removed
