"""After a stop request, every process but trainer 0 stays until trainer 0 is gone."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from shadowsync.lifecycle import attempts
from shadowsync.lifecycle.stop import STOP


def follow_trainer0(out: Path) -> None:
    """After a stop request every process but trainer 0 waits for trainer 0, which saves the
    final checkpoint and then ends the job: the process stays while trainer 0 runs (however
    long a loaded machine makes the save, up to the stop's hard limit; its short grace would
    have ended it mid-save) and leaves as soon as trainer 0 is gone. If trainer 0 died instead
    (the launcher stops every process after one died), nobody will end the job: leaving at
    once lets a restarted attempt begin. (Processes of one host, launched locally; elsewhere
    trainer 0 extends the grace by RPC as its stop makes progress.)"""

    def on_stop(signum: int) -> None:
        pid = next((p for a, n, p in attempts.processes(out)
                    if a == attempts.attempt() and n == "trainer0"), None)
        if pid is None:
            return

        def watch() -> None:
            while attempts.alive(pid):
                STOP.extend()
                time.sleep(0.1)
            logging.shutdown()
            os._exit(128 + signum)

        threading.Thread(target=watch, name="follow-trainer0", daemon=True).start()

    STOP.on_first_signal(on_stop)
