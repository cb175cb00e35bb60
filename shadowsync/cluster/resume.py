"""What a process of a resumed (or restarted) job loads from the checkpoint, agreed by all.

Before any process trains, the job agrees on two things over its process group
(`agree_on_start`, called once every process has joined):

- that its checkpoint storage is one storage for every host (`check_one_storage`): each
  rank writes a token under the checkpoint root and looks for every other rank's. On hosts
  that each keep their own ``--out`` a save could never gather its shards in one place;
- where it starts (`agreed_checkpoint`): rank 0 finds the checkpoint (the newest published
  step in a restarted attempt, the step --resume names otherwise) and every rank takes its
  answer, so no host resumes from a listing of its own while another starts afresh.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

from shadowsync.checkpoint import shards
from shadowsync.checkpoint.storage import Location, location, remove_tree
from shadowsync.checkpoint.store import (
    checkpoints_at,
    find_checkpoint,
    load_all,
    published,
    read_manifest,
    staging_dir,
)
from shadowsync.config import CheckpointConfig
from shadowsync.errors import UserError
from shadowsync.lifecycle.attempts import attempt
from shadowsync.state_dicts import Checkpointable

# all_gather of one picklable value: every rank's, in rank order
Exchange = Callable[[object], list[object]]


def agree_on_start(checkpoint: CheckpointConfig, out_dir: str | None, rank: int,
                   exchange: Exchange, hosts_apart: bool) -> str | None:
    """--resume as every rank will run it (`checkpoint.resume` where the job starts afresh):
    the checkpoint storage checked to be one for all (where the job spans hosts:
    `hosts_apart`; `out_dir`: --out), and the checkpoint it starts from agreed."""
    if hosts_apart and not checkpoint.every.never:
        check_one_storage(checkpoint, out_dir, rank, exchange)
    found = agreed_checkpoint(checkpoint, out_dir, rank, exchange)
    if attempt() == 0 and not checkpoint.resume:
        return checkpoint.resume
    return found


def check_one_storage(checkpoint: CheckpointConfig, out_dir: str | None, rank: int,
                      exchange: Exchange) -> None:
    """Refuse, on every rank, a checkpoint root that some rank does not share: each writes
    a token there, and after all have, each looks for all the others' (`out_dir`: --out)."""
    root = checkpoints_at(checkpoint, out_dir)
    probe = staging_dir(root, f"hosts-{exchange(uuid.uuid4().hex)[0]}")
    mine = (socket.gethostname(), str(root))
    error = ""
    try:
        probe.mkdir(parents=True, exist_ok=True)
        (probe / f"rank-{rank}").write_text(mine[0], encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - any store's refusal, said in the one line
        error = f"{type(e).__name__}: {e}"
    everyone = exchange(mine)  # every rank has written (or failed to) before any looks
    unseen = [r for r in range(len(everyone)) if not _exists(probe / f"rank-{r}")]
    verdicts = exchange((unseen, error))
    exchange(None)  # every rank has looked: the probe can go
    try:
        remove_tree(probe)  # on each host that has one of its own, too
    except OSError:
        pass
    for r, (missing, failed) in enumerate(verdicts):
        if failed or missing:
            raise UserError(not_one_storage(checkpoint, out_dir, r, everyone, missing,
                                            failed))


def _exists(path: Location) -> bool:
    try:
        return path.exists()
    except Exception:  # noqa: BLE001 - a store that cannot say: not seen
        return False


def not_one_storage(checkpoint: CheckpointConfig, out_dir: str | None, rank: int,
                    everyone: list[object], missing: list[int], failed: str) -> str:
    """The one line that refuses a checkpoint storage some rank does not share."""
    option, value = (("--checkpoint-dir", checkpoint.dir) if checkpoint.dir
                     else ("--out", out_dir))
    host, root = everyone[rank]
    what = (f"rank {rank} (host {host}) cannot write {root}: {failed}" if failed else
            f"rank {rank} (host {host}) does not see what rank {missing[0]} (host "
            f"{everyone[missing[0]][0]}) wrote in {root}")
    return (f"{option} {value}: checkpoints must be one storage for every host, but {what}; "
            "put --out on a file system every host mounts, or keep checkpoints at an fsspec "
            "URL every host reaches (--checkpoint-dir s3://..., gs://...)")


def agreed_checkpoint(checkpoint: CheckpointConfig, out_dir: str | None, rank: int,
                      exchange: Exchange) -> str | None:
    """The checkpoint every rank resumes from, rank 0's answer: in a restarted attempt the
    newest published checkpoint (or none yet: from the start), else the step --resume names
    (`out_dir`: --out)."""
    found, error = None, None
    if rank == 0:
        try:
            found = start_checkpoint(checkpoint, out_dir)
        except UserError as e:  # said by every rank, not only by rank 0 while the others wait
            error = str(e)
    found, error = exchange((found, error))[0]
    if error:
        raise UserError(error)
    return found


def start_checkpoint(checkpoint: CheckpointConfig, out_dir: str | None) -> str | None:
    """The checkpoint this process would start from, by its own listing."""
    if attempt() > 0:
        found = published(checkpoints_at(checkpoint, out_dir)) if out_dir or checkpoint.dir \
            else []
        return str(found[-1]) if found else None
    if checkpoint.resume:
        return str(find_checkpoint(checkpoint.resume, "--resume"))
    return None


def hosts_apart() -> bool:
    """The job's processes were started by more than one agent (torchrun on many hosts)."""
    world = os.environ.get("WORLD_SIZE")
    return world is not None and os.environ.get("LOCAL_WORLD_SIZE", world) != world


def own_shard(checkpoint: CheckpointConfig, shard: str, part: Checkpointable, what: str,
              known: bool = True) -> None:
    """Register a server's state for checkpoints and, resuming, load it. `known`: the
    tensors exist already (else they are created from the checkpoint)."""
    shards.register(shard, "state", part)
    source = checkpoint.resume or checkpoint.warm_start  # a server's state is learned
    if not source:
        return
    if known:
        shards.load_here(source, shard, {"state": part}, what)
    else:
        saved = load_all(location(source) / shard, what)
        part.load_state_dict({k.removeprefix("state/"): v for k, v in saved.items()})


def pushes_to_rewind(checkpoint: CheckpointConfig) -> int:
    """A checkpoint taken while training holds pushes past the workers' positions, which the
    resumed workers push again: the dense servers count them once (0: not resuming)."""
    if not checkpoint.resume:
        return 0
    positions = read_manifest(checkpoint.resume, "--resume").get("positions") or {}
    return sum(sum(p) for p in positions.values())

