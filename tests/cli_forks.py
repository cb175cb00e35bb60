"""`python -m shadowsync.cli ARGS` without the interpreter's start-up each time: a server that
has imported what the command imports at its start (torch among it, a second and a half of
CPU) forks a child for each command, and the child runs the module as `-m` runs it (as
`__main__`, with `sys.argv`, `sys.path[0]` the working directory, the caller's environment),
in a session of its own, its output into the caller's named pipes. The command's own work,
its job's processes and what they print are those of a fresh `python -m`.

Run by tests.helpers.run_cli (`python tests/cli_forks.py`); a request is one JSON line on
stdin, {"args", "cwd", "env", "stdout", "stderr"}, answered by {"pid"} once the child runs
and {"returncode"} once it ended. What the imports printed comes first: {"stdout",
"stderr"}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def _import_quietly() -> tuple[str, str]:
    """Import shadowsync.cli with fd 1 and 2 in files: what importing it printed (a fresh
    `python -m` prints it before anything of its own)."""
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            import shadowsync.cli  # noqa: F401
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        out.seek(0)
        err.seek(0)
        return out.read(), err.read()


def _child(request: dict) -> None:
    """In the forked child: become `python -m shadowsync.cli ARGS` and never return."""
    import runpy
    import signal

    os.setsid()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # as `python -m` puts it there
    sys.argv = ["-m", *request["args"]]  # runpy sets argv[0] to the module's file
    # As before `python -m` runs it: its imports done, the module itself not imported.
    del sys.modules["shadowsync.cli"]
    delattr(sys.modules["shadowsync"], "cli")
    code = 1
    try:
        runpy.run_module("shadowsync.cli", run_name="__main__", alter_sys=True)
        code = 0  # the module returned instead of exiting: as the interpreter would
    except SystemExit as e:  # argparse's errors and --help end so
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:  # an interpreter dies of the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        sys.excepthook(*sys.exc_info())
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _answer(item: dict) -> None:
    sys.stdout.write(json.dumps(item) + "\n")
    sys.stdout.flush()


def serve() -> None:
    sys.path[0] = os.getcwd()  # the checkout it was started in, as `python -m` finds it
    out, err = _import_quietly()
    _answer({"stdout": out, "stderr": err})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(request)
            finally:
                os._exit(1)
        _answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer({"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
