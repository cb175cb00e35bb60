"""Where the processes of one attempt of a job meet: a TCP store whose keys carry the attempt.

The elastic agent keeps one TCP store for the whole job and gives it to every attempt it
starts (torch's dynamic rendezvous shares its store server across restart rounds). Process
groups and RPC write fixed keys into it (`default_pg/...`, `rpc_prefix_0/...`): processes
restarted after a failure would read the addresses the dead attempt left there and fail
to connect. So every key of ours lives under `attempt-N/`, N being the job's attempt (the
agent's restart count, `TORCHELASTIC_RESTART_COUNT`, made one for all hosts by
`agree_on_attempt`), through a rendezvous handler registered under the scheme
`shadowsync://HOST:PORT?attempt=N`, where every process is a client of the agent's store.
Without the agent's store (`init_method` / `tcp://`), rank 0 hosts a store of its own, which
dies with it: a restarted attempt gets a fresh one, and torch's handlers serve as they are.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

from shadowsync.lifecycle import attempts

SCHEME = "shadowsync"


def attempt() -> int:
    """How many times the agent restarted this job before starting this process."""
    return attempts.attempt()


def agree_on_attempt() -> None:
    """Make this process's attempt number the job's, the same on every host.

    An agent counts a restart when one of its own processes failed, but not when it restarts
    them because another host's agent asked for a new round (a membership change, in torch's
    words): after a process dies on one host, the hosts' restart counts can differ, and
    processes meeting under `attempt-N/` keys would never meet. Where several agents share
    the job (torchrun on many hosts), every process of every attempt adds one to a counter in
    the agent's store as it starts, before it meets anyone: the k-th world's worth of starts
    is attempt k on every host. That count replaces the agent's in this process's environment
    (its children inherit it). A process killed before it counted itself (in its first
    seconds) would shift the count: the next attempt's meeting then times out and fails."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not agent_store() or int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return  # one agent: its restart count is the job's
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=60))
    started = store.add("shadowsync/processes-started", 1)
    os.environ[attempts.RESTART_COUNT] = str((started - 1) // world)


def agent_store() -> bool:
    """The launcher's agent hosts the job's TCP store (torch's default under torchrun)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def local_address(toward: str) -> str:
    """This host's address on the route to `toward` (the job's store): what a server of this
    process binds and advertises, so peers on other hosts reach it (loopback when the job
    meets on loopback). A UDP socket's connect picks the route and sends nothing."""
    family = socket.AF_INET6 if ":" in toward else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))
        return s.getsockname()[0]


def url(addr: str, port: int, attempt: int, agent: bool) -> str:
    """The init_method of a process group or of RPC meeting at ADDR:PORT: this attempt's
    keys of the agent's store, or torch's own `tcp://` (rank 0 hosts) without one."""
    if not agent:
        return f"tcp://{addr}:{port}"
    return f"{SCHEME}://{addr}:{port}?attempt={attempt}"


def _handler(where: str, timeout: timedelta = timedelta(seconds=300),
             **_: Any) -> Iterator[tuple[dist.Store, int, int]]:
    parsed = urlparse(where)
    query = dict(parse_qsl(parsed.query))
    rank, world = int(query["rank"]), int(query["world_size"])
    store = dist.TCPStore(parsed.hostname or "127.0.0.1", int(parsed.port or 0),
                          world_size=world, is_master=False, timeout=timeout)
    yield dist.PrefixStore(f"attempt-{query['attempt']}", store), rank, world
    raise RuntimeError(f"{SCHEME}:// rendezvous happens once per attempt")


register_rendezvous_handler(SCHEME, _handler)
