"""Where checkpoints live and how they are written, published, found and read.

A run keeps its checkpoints under one root: ``OUT/checkpoint/`` unless ``--checkpoint-dir``
names another directory or an fsspec URL (`storage`). The root holds ``step-N/`` (N: training
examples the checkpoint accounts for, all trainers together), and with --val-share ``best/``.
One step directory holds:

- one torch.distributed.checkpoint (DCP) directory per process that owns state
  (``trainer0/``, ``emb0/``, ``dense0/``...), each written by that process with DCP's
  no-dist mode;
- ``config.toml`` (the resolved options) and ``manifest.json`` (the step, the shards, the
  reader positions in words, the examples trained twice).

Why one no-dist DCP save per process rather than one collective save: the processes of a job
are not one process group that could take part in a collective save at any moment. Embedding
and dense servers only answer RPCs, trainers run a background sync thread of their own on the
trainers' group, and a save is wanted while all of them keep serving. So trainer 0 asks each
process by RPC to save its own shard into one staging directory under the root (on the same
storage, whichever host the process runs on), checks that every shard is there, moves the
directory to ``step-N`` and writes the manifest last: a step is published by its manifest,
and a reader never sees a half step. Staging directories are named ``.tmp-*``; a crash at any
moment leaves either a published step or one that is not (a ``.tmp-*``, or a ``step-N``
without a manifest), which readers ignore and `prune` removes.

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
import tempfile
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING

import torch

from shadowsync.checkpoint.storage import Location, Url, local_copy, location, move, remove_tree
from shadowsync.config import CheckpointConfig, TrainConfig, load_config
from shadowsync.errors import UserError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

CHECKPOINT_DIR = "checkpoint"
BEST = "best"  # --val-share: the model that validated best (the run's model for eval / load)
MANIFEST = "manifest.json"
CONFIG = "config.toml"
SHARD_DONE = ".metadata"  # DCP writes a shard's metadata file last
STAGING = ".tmp-"  # every directory of the root whose name starts so is unfinished
FORMAT = 1
_STEP = re.compile(r"^step-(\d+)$")


def checkpoints_at(checkpoint: CheckpointConfig, out_dir: str | None) -> Location:
    """Where a run keeps its checkpoints: --checkpoint-dir, else OUT/checkpoint (`out_dir`:
    --out)."""
    if checkpoint.dir:
        return location(checkpoint.dir, "--checkpoint-dir")
    return Path(out_dir or ".") / CHECKPOINT_DIR


def step_dir(root: Location, step: int) -> Location:
    return root / f"step-{step}"


def staging_dir(root: Location, tag: str) -> Location:
    """A directory being filled (a save, a storage probe), never read as a checkpoint."""
    return root / f"{STAGING}{tag}"


def published(root: Location) -> list[Location]:
    """The published checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP.match(p.name)) and (p / MANIFEST).is_file()]
    return [p for _, p in sorted(steps)]


class ShardsMissing(UserError):
    """A save found shards missing from its staging directory: the storage is not one for
    every process of the job (each host wrote into its own)."""


def publish(staging: Location, final: Location, manifest: dict[str, object],
            config_toml: str) -> Location:
    """Check that every shard `manifest` lists is complete in `staging`, write the config,
    move `staging` to `final`, and write the manifest there last (that publishes it)."""
    missing = [s for s in manifest.get("shards", []) if not (staging / s / SHARD_DONE).exists()]
    if missing:
        remove_tree(staging)
        raise ShardsMissing(
            f"checkpoint not published in {final.parent}: shard {', '.join(missing)} is not "
            "there (its process wrote to a storage of its own host): keep checkpoints where "
            "every host reaches them (--out on a shared file system, or --checkpoint-dir URL)")
    (staging / CONFIG).write_text(config_toml, encoding="utf-8")
    if final.exists():  # the same step saved again (e.g. a stop right after a periodic save)
        (final / MANIFEST).unlink(missing_ok=True)  # unpublished first, then removed
        remove_tree(final)
    move(staging, final)
    tmp = final / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, **manifest}, indent=1), encoding="utf-8")
    move(tmp, final / MANIFEST)  # atomic: a reader sees all of the manifest or none
    if isinstance(final, Path):
        _fsync_dir(final)
        _fsync_dir(final.parent)
    return final


def unfinished(root: Location) -> list[Location]:
    """What killed saves (and probes) left under `root`: ``.tmp-*`` directories, whatever
    follows the prefix, and step or best directories without a manifest."""
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.name.startswith(STAGING)
            or ((_STEP.match(p.name) or p.name == BEST) and not (p / MANIFEST).is_file())]


def prune(root: Location, keep: int) -> None:
    """Keep the newest `keep` published checkpoints; remove what unfinished saves left.
    Called by the one process that saves, between its saves."""
    for old in published(root)[:-keep] if keep > 0 else []:
        remove_tree(old)
    for left in unfinished(root):
        remove_tree(left)


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


def find_checkpoint(path: str | Location, option: str = "--checkpoint",
                    latest: bool | None = None) -> Location:
    """A run directory or its checkpoint/ directory, or any checkpoint root (its best model
    if it kept one, else its newest step; `latest`, default for --resume: always the newest
    step), or one step. A local path or an fsspec URL."""
    p = location(path, option)
    latest = option == "--resume" if latest is None else latest
    if not p.exists():
        raise UserError(f"{option} {p}: no such file or directory")
    if (p / MANIFEST).exists() or _STEP.match(p.name):
        read_manifest(p, option)
        return p
    roots = [p / CHECKPOINT_DIR, p] if (p / CHECKPOINT_DIR).is_dir() else [p]
    elsewhere = _checkpoint_dir_of(p)
    if elsewhere is not None:  # a run directory whose checkpoints went to --checkpoint-dir
        roots.insert(0, location(elsewhere, option))
    for root in roots:
        best = root / BEST
        if not latest and (best / MANIFEST).is_file():
            read_manifest(best, option)
            return best
        found = published(root)
        if found:
            return found[-1]
    raise UserError(f"{option} {p}: no checkpoint there (expected {CHECKPOINT_DIR}/step-N/ "
                    "with a manifest.json)")


def _checkpoint_dir_of(run: Location) -> str | None:
    """The --checkpoint-dir of the run whose directory is `run`, if it named one."""
    if not isinstance(run, Path) or not (run / CONFIG).is_file():
        return None
    try:
        cfg = load_config(SimpleNamespace(config=str(run / CONFIG)), absent=PREDATED)
        return cfg.checkpoint.dir
    except (UserError, OSError, ValueError, TypeError):
        return None


def read_manifest(step: Location, option: str = "--checkpoint") -> dict[str, object]:
    step = location(step, option)
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
PREDATED = {"id_bias": False, "interaction": "dot", "early_stop": 0, "buckets": 0,
            "weight_average_from": 0}


def saved_config(step: Location) -> TrainConfig:
    """The resolved options (`TrainConfig`) checkpoint `step` was saved with."""
    with tempfile.TemporaryDirectory(prefix="shadowsync-config-") as tmp:
        path = local_copy(location(step) / CONFIG, Path(tmp))
        return load_config(SimpleNamespace(config=str(path)), absent=PREDATED)


# -- one process's shard --

def space_short(directory: Location, state: dict[str, torch.Tensor]) -> str | None:
    """Why `state` will not fit in `directory`'s file system (None: it fits; a URL's store
    does not say). Checked before writing: a full disk otherwise shows as a zip writer's
    "unexpected pos" from deep inside torch.save, and leaves half a shard behind."""
    if isinstance(directory, Url):
        return None
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
    # with its api and metadata modules, and its fsspec storage (`_fsspec`)
    import torch.distributed.checkpoint._fsspec_filesystem  # noqa: F401

    return torch.distributed.checkpoint


def _fsspec() -> ModuleType:
    """DCP's fsspec storage (FsspecWriter / FsspecReader: any URL fsspec knows)."""
    return checkpoint_library()._fsspec_filesystem


def save_shard(directory: Location, state: dict[str, torch.Tensor]) -> None:
    """Write tensors with DCP, no process group involved (a URL through DCP's fsspec
    writer)."""
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
            writer = (_fsspec().FsspecWriter(str(directory)) if isinstance(directory, Url)
                      else dcp.FileSystemWriter(str(directory)))
            dcp.save(plain, checkpoint_id=str(directory), storage_writer=writer, no_dist=True)
        except CheckpointException as e:  # a BaseException, whose text is a traceback
            cause = next(iter(e.failures.values()))[0] if e.failures else e
            raise ShardNotWritten(f"checkpoint shard {directory}: {type(cause).__name__}: "
                                  f"{cause}") from None


def load_shard(directory: Location, state: dict[str, torch.Tensor], what: str,
               strict: bool = True) -> None:
    """Read `directory` into the tensors of `state` (in place, same shapes), or UserError.
    `strict`: the shard must hold exactly these entries (else: at least these)."""
    dcp = checkpoint_library()
    CheckpointException = dcp.api.CheckpointException  # noqa: N806 - the library's class
    TensorStorageMetadata = dcp.metadata.TensorStorageMetadata  # noqa: N806

    if not directory.is_dir():
        raise UserError(f"checkpoint {directory.parent}: incomplete, no shard {directory.name}")
    reader = SafeFileSystemReader(directory)
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


def load_all(directory: Location, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of a shard, for holders whose contents are only known from the file."""
    TensorStorageMetadata = checkpoint_library().metadata.TensorStorageMetadata  # noqa: N806

    try:
        meta = SafeFileSystemReader(directory).read_metadata()
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


def _safe_reader_class(url: bool) -> type:
    dcp = checkpoint_library()
    Reader = _fsspec().FsspecReader if url else dcp.FileSystemReader  # noqa: N806
    StorageMeta = dcp.metadata.StorageMeta  # noqa: N806

    class _Safe(Reader):
        def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as fh:
                metadata = _MetadataUnpickler(fh).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _Safe


def SafeFileSystemReader(path: Location) -> FileSystemReader:  # noqa: N802 - reads like a class
    return _safe_reader_class(isinstance(path, Url))(str(path))
