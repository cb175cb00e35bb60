"""Where checkpoints live on disk and how they are written, published, found and read.

A run directory holds ``checkpoint/step-N/`` (N: training examples the checkpoint accounts
for, all trainers together). One step directory holds:

- one torch.distributed.checkpoint (DCP) directory per process that owns state
  (``trainer0/``, ``emb0/``, ``dense0/``...), each written by that process with DCP's
  no-dist mode;
- ``config.toml`` (the resolved options) and ``manifest.json`` (the step, the shards, the
  reader positions in words, the examples trained twice).

Why one no-dist DCP save per process rather than one collective save: the processes of a job
are not one process group that could take part in a collective save at any moment. Embedding
and dense servers only answer RPCs, trainers run a background sync thread of their own on the
trainers' group, and a save is wanted while all of them keep serving. So trainer 0 asks each
process by RPC to save its own shard under a staging directory ``checkpoint/.tmp-step-N``,
writes the manifest last, and publishes the whole step by one rename. A crash at any moment
leaves either a complete ``step-N`` or a staging directory that is ignored and removed later.

Loading never unpickles arbitrary objects: shards hold tensors only (counts are 0-d tensors),
DCP reads tensor data with ``torch.load(weights_only=True)``, and the DCP metadata file is
read by an unpickler that accepts only DCP's own metadata classes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING

import torch

from shadowsync.config import TrainConfig, load_config
from shadowsync.errors import UserError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

CHECKPOINT_DIR = "checkpoint"
BEST = "best"  # --val-share: the model that validated best (the run's model for eval / load)
MANIFEST = "manifest.json"
CONFIG = "config.toml"
FORMAT = 1
_STEP = re.compile(r"^step-(\d+)$")


def step_dir(run: Path, step: int) -> Path:
    return Path(run) / CHECKPOINT_DIR / f"step-{step}"


def staging_dir(run: Path, step: int) -> Path:
    return Path(run) / CHECKPOINT_DIR / f".tmp-step-{step}"


def published(run: Path) -> list[Path]:
    """The run's published checkpoints, oldest first."""
    root = Path(run) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP.match(p.name)) and (p / MANIFEST).is_file()]
    return [p for _, p in sorted(steps)]


def publish(staging: Path, final: Path, manifest: dict[str, object], config_toml: str) -> Path:
    """Write the manifest and config into `staging`, then rename it to `final`."""
    (staging / CONFIG).write_text(config_toml, encoding="utf-8")
    tmp = staging / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, **manifest}, indent=1), encoding="utf-8")
    os.replace(tmp, staging / MANIFEST)
    if final.exists():  # the same step saved again (e.g. a stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(staging, final)
    _fsync_dir(final.parent)
    return final


def prune(run: Path, keep: int) -> None:
    """Keep the newest `keep` published checkpoints; drop stale staging directories."""
    root = Path(run) / CHECKPOINT_DIR
    for old in published(run)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(".tmp-step-*") if root.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def find_checkpoint(path: str | Path, option: str = "--checkpoint",
                    latest: bool | None = None) -> Path:
    """A run directory or its checkpoint/ directory (its best model if it kept one, else its
    newest step; `latest`, default for --resume: always the newest step), or one step."""
    p = Path(path)
    latest = option == "--resume" if latest is None else latest
    if not p.exists():
        raise UserError(f"{option} {p}: no such file or directory")
    if (p / MANIFEST).exists() or _STEP.match(p.name):
        read_manifest(p, option)
        return p
    run = p.parent if p.name == CHECKPOINT_DIR else p
    best = run / CHECKPOINT_DIR / BEST
    if not latest and (best / MANIFEST).is_file():
        read_manifest(best, option)
        return best
    found = published(run)
    if not found:
        raise UserError(f"{option} {p}: no checkpoint there (expected {CHECKPOINT_DIR}/step-N/ "
                        "with a manifest.json)")
    return found[-1]


def read_manifest(step: Path, option: str = "--checkpoint") -> dict[str, object]:
    try:
        manifest = json.loads((step / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{option} {step}: incomplete checkpoint (no {MANIFEST})") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{option} {step}: corrupt checkpoint ({MANIFEST}: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{option} {step}: corrupt checkpoint or unknown format ({MANIFEST})")
    if not (step / CONFIG).is_file():
        raise UserError(f"{option} {step}: incomplete checkpoint (no {CONFIG})")
    return manifest


# Options added after checkpoints were first written, with the value every run before them
# had: a checkpoint whose config.toml lacks one was saved by such a run. (early_stop: such a
# run wrote none where it had no stopping; a run now writes the value --val-share adapted.)
PREDATED = {"id_bias": False, "interaction": "dot", "early_stop": 0}


def saved_config(step: Path) -> TrainConfig:
    """The resolved options (`TrainConfig`) checkpoint `step` was saved with."""
    return load_config(SimpleNamespace(config=str(Path(step) / CONFIG)), absent=PREDATED)


def run_of(step: Path) -> Path:
    """The run directory a step directory belongs to."""
    return step.parent.parent


# -- one process's shard --

def space_short(directory: Path, state: dict[str, torch.Tensor]) -> str | None:
    """Why `state` will not fit in `directory`'s file system (None: it fits). Checked before
    writing: a full disk otherwise shows as a zip writer's "unexpected pos" from deep inside
    torch.save, and leaves half a shard behind."""
    need = sum(v.numel() * v.element_size() for v in state.values())
    where = Path(directory)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need <= free:
        return None
    return (f"shard {Path(directory).name} needs {_size(need)} and its disk has "
            f"{_size(free)} free")


def _size(n: int) -> str:
    return next(f"{n / 2**k:,.1f} {unit}" for k, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"),
                                                          (0, "bytes")) if n >= 2**k or k == 0)


class ShardNotWritten(RuntimeError):
    """Writing a shard failed (the file system refused): what failed, in one line."""


def checkpoint_library() -> ModuleType:
    """torch.distributed.checkpoint (DCP), imported on first use: start-up cost (it takes
    seconds to import, and only a process that saves or loads a checkpoint needs it)."""
    import torch.distributed.checkpoint  # noqa: F401 - with its api and metadata modules

    return torch.distributed.checkpoint


def save_shard(directory: Path, state: dict[str, torch.Tensor]) -> None:
    """Write tensors with DCP, no process group involved."""
    dcp = checkpoint_library()
    CheckpointException = dcp.api.CheckpointException  # noqa: N806 - the library's class

    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"checkpoint entry {key!r} must be a tensor, got {type(value)}")
    # DCP writes from the storage: shared-memory or non-contiguous views are copied.
    plain = {k: v.detach().clone() for k, v in state.items()}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.save(plain, checkpoint_id=str(directory), no_dist=True)
        except CheckpointException as e:  # a BaseException, whose text is a traceback
            cause = next(iter(e.failures.values()))[0] if e.failures else e
            raise ShardNotWritten(f"checkpoint shard {directory}: {type(cause).__name__}: "
                                  f"{cause}") from None


def load_shard(directory: Path, state: dict[str, torch.Tensor], what: str,
               strict: bool = True) -> None:
    """Read `directory` into the tensors of `state` (in place, same shapes), or UserError.
    `strict`: the shard must hold exactly these entries (else: at least these)."""
    dcp = checkpoint_library()
    CheckpointException = dcp.api.CheckpointException  # noqa: N806 - the library's class
    TensorStorageMetadata = dcp.metadata.TensorStorageMetadata  # noqa: N806

    if not directory.is_dir():
        raise UserError(f"checkpoint {directory.parent}: incomplete, no shard {directory.name}")
    reader = SafeFileSystemReader(str(directory))
    try:
        meta = reader.read_metadata()
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line
        raise UserError(f"checkpoint {directory.parent}: corrupt shard {directory.name} "
                        f"({type(e).__name__}: {e})") from None
    saved = meta.state_dict_metadata
    missing = sorted(set(state) - set(saved))
    extra = sorted(set(saved) - set(state)) if strict else []
    if missing or extra:
        raise UserError(f"checkpoint {directory.parent}: {what} was saved by another model or "
                        f"configuration (missing {missing[:3]}, unexpected {extra[:3]})")
    for key, target in state.items():
        m = saved[key]
        if not isinstance(m, TensorStorageMetadata):
            raise UserError(f"checkpoint {directory.parent}: {what}: {key} is not a tensor")
        if tuple(m.size) != tuple(target.shape):
            raise UserError(f"checkpoint {directory.parent}: {what} was saved by another model "
                            f"shape ({key}: {tuple(m.size)} there, {tuple(target.shape)} here)")
    fresh = {k: torch.empty_like(v) for k, v in state.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(fresh, checkpoint_id=str(directory), storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as e:  # a BaseException in DCP
        first = _last_line(e)
        raise UserError(f"checkpoint {directory.parent}: corrupt shard {directory.name} "
                        f"({first})") from None
    with torch.no_grad():
        for k, v in state.items():
            v.copy_(fresh[k])


def load_all(directory: Path, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of a shard, for holders whose contents are only known from the file."""
    TensorStorageMetadata = checkpoint_library().metadata.TensorStorageMetadata  # noqa: N806

    try:
        meta = SafeFileSystemReader(str(directory)).read_metadata()
    except FileNotFoundError:
        raise UserError(f"checkpoint {directory.parent}: incomplete, no shard "
                        f"{directory.name}") from None
    except Exception as e:  # noqa: BLE001
        raise UserError(f"checkpoint {directory.parent}: corrupt shard {directory.name} "
                        f"({type(e).__name__}: {e})") from None
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for k, m in meta.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    load_shard(directory, state, what)
    return state


def _last_line(e: BaseException) -> str:
    """The innermost message of a DCP error (it wraps the failure with a whole traceback)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    useful = [ln for ln in lines if "Error" in ln and not ln.startswith("File ")]
    return (useful[-1] if useful else lines[0] if lines else type(e).__name__)[:200]


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata file and nothing else (no arbitrary callables)."""

    ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata",
                       "torch.distributed.checkpoint.filesystem",
                       "torch.distributed.checkpoint.planner")
    ALLOWED = {("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
               ("collections", "OrderedDict"), ("builtins", "set"),
               ("builtins", "frozenset"), ("torch.serialization", "_get_layout"),
               ("torch._utils", "_rebuild_tensor_v2")}

    def find_class(self, module: str, name: str) -> object:
        if module in self.ALLOWED_MODULES or (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "torch" and name in ("strided", "contiguous_format", "preserve_format"):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in checkpoint metadata")


def _safe_reader_class() -> type:
    dcp = checkpoint_library()
    FileSystemReader, StorageMeta = dcp.FileSystemReader, dcp.metadata.StorageMeta  # noqa: N806

    class _Safe(FileSystemReader):
        def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as fh:
                metadata = _MetadataUnpickler(fh).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _Safe


def SafeFileSystemReader(path: str) -> FileSystemReader:  # noqa: N802 - reads like the class it makes
    return _safe_reader_class()(path)
