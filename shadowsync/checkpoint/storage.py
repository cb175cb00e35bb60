"""Where checkpoints are kept: a local directory (`pathlib.Path`) or an fsspec URL (`Url`),
behind the few pathlib methods checkpoints use, so one code path serves both.

A URL names any file system fsspec knows: ``file://`` and ``memory://`` come with fsspec,
``s3://`` and ``gs://`` with the package of that name (``pip install 'shadowsync[cloud]'``).
Every host of a job reaches the same objects at the same URL, which is what a job across
hosts needs of its checkpoints (a local path is one storage only where every host mounts it).
Object stores have no directories and no atomic rename of one: what makes a step appear at
once is its manifest, written last (see `store.publish`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shadowsync.errors import UserError

EXTRA = "pip install 'shadowsync[cloud]' (s3fs, gcsfs) or the fsspec package for"


class Url:
    """A file or directory at an fsspec URL, with the pathlib methods checkpoints use."""

    def __init__(self, url: str, option: str = "checkpoint") -> None:
        from fsspec.core import url_to_fs  # start-up: fsspec imports its registry

        try:
            self.fs, path = url_to_fs(url)
        except (ImportError, ValueError) as e:
            scheme = url.split("://", 1)[0]
            raise UserError(f"{option} {url}: no file system for {scheme}:// ({EXTRA} it: "
                            f"{e})") from None
        self.path = path.rstrip("/") or path

    @classmethod
    def _at(cls, fs: object, path: str) -> Url:
        u = cls.__new__(cls)
        u.fs, u.path = fs, path
        return u

    def __str__(self) -> str:
        return self.fs.unstrip_protocol(self.path)

    def __repr__(self) -> str:
        return f"Url({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Url) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __truediv__(self, name: str) -> Url:
        return Url._at(self.fs, f"{self.path}/{name}")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Url:
        return Url._at(self.fs, self.path.rsplit("/", 1)[0] if "/" in self.path else self.path)

    def resolve(self) -> Url:
        return self

    def exists(self) -> bool:
        self.fs.invalidate_cache(self.path)  # object stores cache listings: what is there now
        return self.fs.exists(self.path)

    def is_dir(self) -> bool:
        self.fs.invalidate_cache(self.path)
        return self.fs.isdir(self.path)

    def is_file(self) -> bool:
        self.fs.invalidate_cache(self.path)
        return self.fs.isfile(self.path)

    def iterdir(self) -> list[Url]:
        self.fs.invalidate_cache(self.path)
        try:
            names = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return []
        return [self / str(n).rstrip("/").rsplit("/", 1)[-1] for n in names
                if str(n).rstrip("/") != self.path]

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        self.fs.makedirs(self.path, exist_ok=exist_ok)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.fs.cat_file(self.path).decode(encoding)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.fs.pipe_file(self.path, text.encode(encoding))

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.path)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise


Location = Path | Url


def is_url(where: str | os.PathLike[str] | Url) -> bool:
    return isinstance(where, Url) or (isinstance(where, str) and "://" in where)


def location(where: str | os.PathLike[str] | Url, option: str = "checkpoint") -> Location:
    """A local path as a `Path`, a URL as a `Url` (`option` names it in an error)."""
    if isinstance(where, (Path, Url)):
        return where
    return Url(where, option) if is_url(where) else Path(where)


def remove_tree(where: Location) -> None:
    """Remove a directory and all it holds; nothing if it is not there."""
    if isinstance(where, Url):
        try:
            where.fs.rm(where.path, recursive=True)
        except FileNotFoundError:
            pass
    else:
        shutil.rmtree(where, ignore_errors=True)


def move(source: Location, dest: Location) -> None:
    """Rename `source` to `dest` (a local rename is atomic; an object store copies)."""
    if isinstance(source, Url) and isinstance(dest, Url):
        source.fs.mv(source.path, dest.path, recursive=True)
        dest.fs.invalidate_cache()
    else:
        os.replace(source, dest)


def local_copy(file: Location, into: Path) -> Path:
    """`file` as a local file: itself, or for a URL a copy under `into`."""
    if not isinstance(file, Url):
        return file
    copy = into / file.name
    copy.write_bytes(file.read_bytes())
    return copy
