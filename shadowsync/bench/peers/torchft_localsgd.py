"""torchft's LocalSGD as a peer: the default job with `--sync torchft-ma`, in a private
network namespace.

torchft 0.2 starts a manager server per replica group that listens on every interface
(`[::]`, not configurable) and a lighthouse (ours binds the job's loopback address). So that
nothing listens beyond loopback, the job runs inside a fresh network namespace whose only
interface is `lo` (`unshare --net`, which needs root); elsewhere the peer is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from shadowsync.config import TrainConfig


def unavailable() -> str | None:
    """Why the private namespace cannot be made here (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return ("torchft's manager listens on every interface, so it runs only in a private "
                "network namespace, which needs root")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare and ip (util-linux, iproute2) are needed for a private network namespace"
    return None


def run(cfg: TrainConfig, out: Path, timeout: float = 1800) -> dict[str, Any]:
    """Train `cfg` with torchft LocalSGD every `cfg.sync_every` steps; the result keys of
    one of our runs (from the job's summary)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = out / "job.toml"
    config.write_text(replace(cfg, sync="torchft-ma", out=str(out), progress=False, port=None,
                              rpc_port=None).to_toml())
    argv = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
            sys.executable, "-m", "shadowsync.cli", "train", "-q", "--config", str(config),
            "--out", str(out)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # the mode itself quiets torchft's logs
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"torchft-ma job exited {p.returncode}: {p.stderr.strip()[-800:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"eps": s["train_eps"], "eval_ne": s["eval_ne"], "syncs_per_min": s["syncs_per_min"],
            "sync_blocked_fraction": s["sync_blocked_fraction"], "wall_s": s["wall_s"],
            "teacher_eval_ne": s["teacher_eval_ne"], "examples": s["examples"],
            "period": cfg.sync.every}
