"""User-facing errors: one line, exit code 2, no traceback."""


class UserError(Exception):
    """A mistake in the user's input (data, config, flags). The CLI prints it on one line."""

    exit_code = 2


class PeerLost(UserError):
    """A process failed because another process of the job died (a killed worker, a server
    gone): restarting the job from its checkpoint can cure it (--max-restarts)."""
