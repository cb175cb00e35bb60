"""Why a process of a job ended, as an exception in the process and an exit status outside.

A role process ends with one of the statuses below; the launcher reads them back from the
elastic agent (or from the restart refusal, `attempts.refuse_restart`) and raises the
matching exception, so the caller acts on a type, never on the words of a message:

    EXIT_OK         0   the role finished
    EXIT_FAILED     1   an unexpected failure (a bug): the traceback is on stderr
    EXIT_USER       2   bad input or a lost peer (`UserError`): one line in error.txt
    EXIT_DIVERGED   3   the loss became NaN / infinite / exploded (`TrainingDiverged`);
                        `--on-divergence rollback` resumes from the last good checkpoint
    128 + signal        stopped by SIGINT / SIGTERM (`stop.Interrupted`)
"""

from __future__ import annotations

from shadowsync.errors import UserError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER = UserError.exit_code
EXIT_DIVERGED = 3


class TrainingDiverged(UserError):
    """The training loss became NaN, infinite or exploded. To the user it is one line and
    exit status 2 like any `UserError`; to a process of the job its exit status is
    `EXIT_DIVERGED`, which the launcher turns back into this exception."""


def exit_status(error: BaseException) -> int:
    """The status a role process ends with after `error`."""
    if isinstance(error, TrainingDiverged):
        return EXIT_DIVERGED
    if isinstance(error, UserError):
        return EXIT_USER
    return EXIT_FAILED
