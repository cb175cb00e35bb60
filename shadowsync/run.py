"""Entry point for torchrun: one process of a job, its role taken from its rank.

    torchrun --nnodes 2 --node-rank R --nproc-per-node N --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT -m shadowsync.run --config job.toml

Every process takes the same options as `shadowsync train`; nnodes x nproc-per-node must
equal embedding servers + dense servers + trainers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from shadowsync.cluster.job import CONFIG_FILE
from shadowsync.cluster.parts import resolve
from shadowsync.cluster.roles import role_main
from shadowsync.config import add_config_arguments, load_config
from shadowsync.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shadowsync.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    try:
        args = parser.parse_args(argv)
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if v not in os.environ]
        if missing:
            raise UserError(f"python -m shadowsync.run is started by torchrun (no {missing[0]} "
                            "in the environment); on one machine use: shadowsync train")
        cfg = resolve(load_config(args))
        if cfg.output.dir is None:
            raise UserError("--out is required under torchrun (every host writes there)")
        Path(cfg.output.dir).mkdir(parents=True, exist_ok=True)
        if os.environ.get("RANK") == "0":  # one copy of the options for the whole job
            (Path(cfg.output.dir) / CONFIG_FILE).write_text(cfg.to_toml(), encoding="utf-8")
    except UserError as e:
        print(f"shadowsync: error: {e}", file=sys.stderr)
        return e.exit_code
    role_main(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
