"""Converted data lives in a cache of ``.npy`` files that every process of a run maps.

One process builds a cache directory (under a lock, into a temporary sibling that is moved
into place), the others wait for it and map the same files, so the rows live in the page
cache once however many workers read them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np


def cache_root() -> Path:
    """Where caches go that do not live next to their data."""
    env = os.environ.get("SHADOWSYNC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "shadowsync"


class NpyWriter:
    """Appends rows to a ``.npy`` file whose row count is known only at the end."""

    # A fixed header size lets us write the header once more when the count is known.
    HEADER = 128

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.row_shape, self.rows = path, np.dtype(dtype), row_shape, 0
        self.f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.f.write(b"\0" * self.HEADER)

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        assert arr.shape[1:] == self.row_shape
        self.f.write(arr.data)
        self.rows += len(arr)

    def close(self) -> None:
        shape = (self.rows, *self.row_shape)
        text = repr(
            {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": shape,
            }
        )
        body = text.ljust(self.HEADER - 10 - 1) + "\n"
        header = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("latin1")
        assert len(header) == self.HEADER
        self.f.seek(0)
        self.f.write(header)
        self.f.close()


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Serialize cache builds for ``target`` among processes (ranks opening the same data)."""
    lock = target.with_name("." + target.name.lstrip(".") + ".lock")
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish_dir(build: Callable[[Path], None], dest: Path) -> None:
    """Run ``build(tmp)`` into a temporary sibling of ``dest``, then move it into place.

    An interrupted build leaves neither a partial ``dest`` nor a damaged old one.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="." + dest.name.lstrip(".") + ".tmp-", dir=dest.parent))
    try:
        # mkdtemp makes the directory private; a cache beside shared data should not be.
        tmp.chmod(0o755)
        build(tmp)
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name.lstrip('.')}.old-{os.getpid()}")
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def built_once(dest: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """``dest``, built by ``build(tmp)`` unless its ``marker`` file exists: the first process
    builds it under the lock, the others wait and then find it (see ``publish_dir``)."""
    if not (dest / marker).exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with build_lock(dest):
            if not (dest / marker).exists():
                publish_dir(build, dest)
    return dest
