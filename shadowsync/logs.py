"""Messages go through the `logging` module, under the `shadowsync` logger, each prefixed by
the role and rank of the process that wrote it (a job's processes share one terminal)."""

from __future__ import annotations

import logging
import sys

LOGGER = "shadowsync"
LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
_HANDLER_NAME = "shadowsync-stderr"


def setup_logging(level: str, role: str, *, respect_existing: bool = False) -> None:
    """Print the `shadowsync` logger's messages at `level` and above to stderr as
    `HH:MM:SS shadowsync[ROLE] LEVEL message`.

    `respect_existing`: leave the handlers alone when the application already configured
    logging (the Python API in someone's script or notebook); only the level is set.
    """
    logger = logging.getLogger(LOGGER)
    logger.setLevel(LEVELS[level])
    ours = [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]
    if respect_existing and not ours and (logger.handlers or logging.getLogger().handlers):
        return
    for h in ours:
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s shadowsync[{role}] %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.propagate = False
