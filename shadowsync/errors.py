"""User-facing errors: one line, exit code 2, no traceback."""

import re


class UserError(Exception):
    """A mistake in the user's input (data, config, flags). The CLI prints it on one line."""

    exit_code = 2


class PeerLost(UserError):
    """A process failed because another process of the job died (a killed worker, a server
    gone): restarting the job from its checkpoint can cure it (--max-restarts)."""


# How torch RPC words an exception a remote function raised: "On WorkerInfo(id=N, name=NAME):"
# then the exception's repr and the remote traceback, one a line (the lines escaped when the
# caller's exception type quotes its message, as KeyError does).
_REMOTE = re.compile(r"On WorkerInfo\([^)]*name=([^)]*)\):(?:\\n|\n)(.*?)(?:\\n|\n|$)")


def failure_line(e: BaseException) -> str:
    """One line for an unexpected failure: the exception's type and the first line of its
    message, or, for an exception a function raised on another process of the job (re-raised
    here by torch RPC, whose message ends with the remote traceback), that process's name and
    the remote exception."""
    text = str(e)
    remote = _REMOTE.search(text)
    if remote:
        return f"on {remote[1]}: " + remote[2].replace("\\'", "'").replace('\\"', '"')
    first = text.partition("\n")[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
