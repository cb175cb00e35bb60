"""Ctrl-C and SIGTERM: stop training at the next step, save a final checkpoint, and exit.

Every process of a job installs `StopRequest.install` once. A trainer subscribes its
`Trainer.request_stop`; its workers then end after their current step, the job saves a
final checkpoint and shuts down as at the end of its data. A server only notes the signal:
it keeps answering until the trainers have saved and left.

A watchdog makes sure a process never outlives the request by more than `grace_s`, even if
a peer died and the orderly shutdown would wait on it: the launcher gives its processes
some time after forwarding the signal, and a user who pressed Ctrl-C expects the job gone
within seconds. A stop that is making progress (trainer 0 saving the final checkpoint on a
loaded machine) extends the grace (`extend`, by RPC from trainer 0 to the others), up to
`HARD_LIMIT_S` after the signal: the launcher kills what is left 30 s after it.

A launched process that is still starting (importing torch, meeting its peers) when the
signal comes has nothing worth saving and no peers to tell: it ends at once, quietly
(`exit_while_starting`). Launched processes take over the signals as soon as they import
shadowsync (`install_in_job_process`), so a Ctrl-C during start-up prints no traceback.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from shadowsync.procfs import start_time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# After SIGINT / SIGTERM a launched process saves, shuts down and is gone within this many
# seconds, more while its stop makes progress (`StopRequest.extend`), never more than
# HARD_LIMIT_S.
STOP_GRACE_S = 8.0
HARD_LIMIT_S = 25.0
# Set by the local launcher for the processes it starts: they install `STOP` on import.
JOB_PROCESS_ENV = "SHADOWSYNC_JOB_PROCESS"


class Interrupted(Exception):
    """The run stopped on a signal; `checkpoint` is where its final state was saved, `kept`
    where the work it finished before the signal lies (a benchmark's runs)."""

    def __init__(self, signum: int, checkpoint: str | None, kept: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.checkpoint = checkpoint
        self.kept = kept

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as shells report


@contextlib.contextmanager
def signals_raise(kept: str | None = None) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise `Interrupted` (`kept`: what is kept) in
    the main thread. SIGTERM would otherwise end the process at once, skipping the `with` and
    `finally` blocks that end what it started (network namespaces and the processes in them);
    SIGINT would raise a bare KeyboardInterrupt. A signal the process ignores (SIGINT in a
    shell's background job) stays ignored; the handlers before are put back after."""

    def handle(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum, None, kept)

    previous = {sig: signal.signal(sig, handle) for sig in SIGNALS
                if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopRequest:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._subscribers: list[Callable[[int], None]] = []
        self._notifying = False  # the main thread is inside a subscriber (`_handle`)
        self._at_first_signal: list[Callable[[int], None]] = []
        self._start_gate = threading.Lock()
        self._children: list[tuple[int, int | None]] = []
        self._starting_in: int | None = None  # the thread starting children, meanwhile
        self._exit_deferred: int | None = None  # a signal to end on once they are started
        # signal.getsignal's answers: a handler, SIG_DFL / SIG_IGN, or None (not set from Python)
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self._grace_s: float | None = None
        self._exit_while_starting = False
        self.running = False  # this process has met its peers: a stop now saves
        self._done = False  # this process's role has returned (`mark_done`)
        self._deadline = 0.0
        self._hard_deadline = 0.0
        self._lock = threading.RLock()  # the handler may run while the main thread holds it

    def install(self, grace_s: float | None = None, exit_while_starting: bool = False) -> bool:
        """Handle SIGINT and SIGTERM in this process (main thread only). `grace_s`: exit
        that many seconds after the first signal, whatever is still running.
        `exit_while_starting`: a signal before `mark_running` ends the process at once.
        With `exit_while_starting`, an ignored SIGINT (a Hogwild worker's) stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._grace_s = grace_s
        self._exit_while_starting = exit_while_starting
        for sig in SIGNALS:
            if sig in self._previous:
                continue
            if (sig == signal.SIGINT and exit_while_starting
                    and signal.getsignal(sig) == signal.SIG_IGN):
                continue  # a Hogwild worker's: its trainer decides
            self._previous[sig] = signal.signal(sig, self._handle)
        if grace_s is not None or exit_while_starting:
            watch_signals(lambda signum: self._note(signum) if self._previous else None)
        return True

    def mark_running(self) -> None:
        """From now on a signal stops the process in order (final checkpoint), not at once."""
        self.running = True

    def extend(self) -> None:
        """The stop is making progress: push the watchdog's deadline `grace_s` from now."""
        with self._lock:
            if self._deadline:
                self._deadline = min(self._hard_deadline,
                                     max(self._deadline, time.monotonic() + (self._grace_s or 0)))

    @contextlib.contextmanager
    def starting_children(self) -> Iterator[Callable[[int], None]]:
        """Around starting child processes; call the value with each one's PID. A process that
        ends at once (a stop while it starts, or its watchdog) first waits until they are
        started, then kills them: a child killed while it unpickles its arguments prints
        nothing, while one whose parent vanished at that moment printed a traceback."""
        try:
            with self._start_gate:
                self._starting_in = threading.get_ident()
                try:
                    # By PID and start time: a worker forked by the fork server is the
                    # server's child, so its parent is no test of whether the PID is its.
                    yield lambda pid: self._children.append((pid, start_time(pid)))
                finally:
                    self._starting_in = None
        finally:
            if self._exit_deferred is not None:
                self._exit_now(self._exit_deferred)

    def _exit_now(self, signum: int) -> None:
        if self._starting_in == threading.get_ident():
            # The handler interrupted this thread while it starts a child, maybe halfway
            # through its request to the fork server (which, cut off, prints a traceback and
            # dies): end once the children are started.
            self._exit_deferred = signum
            return
        silence_stderr()  # peers and half-imported modules would only add noise
        # Not forever: the main thread may be waiting for the lock this thread holds.
        self._start_gate.acquire(timeout=5.0)
        for pid, started in self._children:
            if started is not None and start_time(pid) == started:  # not a reused PID
                os.kill(pid, signal.SIGKILL)
        os._exit(128 + signum)

    def mark_done(self) -> None:
        """This process has done its part and waits only to be collected: a signal now (or
        one that came while it finished) ends it at once, since nothing is left to save."""
        with self._lock:
            self._done = True
            if self.signum is not None and self._exit_while_starting:
                self._exit_now(self.signum)

    def _watchdog(self) -> None:
        while True:
            with self._lock:
                left = self._deadline - time.monotonic()
            if left <= 0:
                if os.environ.get(QUIET_STDERR_ENV):  # where the stop was stuck
                    faulthandler.dump_traceback(all_threads=True)
                self._exit_now(self.signum or signal.SIGTERM)
            time.sleep(min(left, 0.5))

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def uninstall(self) -> None:
        """Give the signals back (a Hogwild worker then handles its own)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._exit_while_starting = False
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)

    def subscribe(self, callback: Callable[[int], None]) -> None:
        """Call `callback(signum)` in the main thread on each signal (it may raise into the
        code the signal interrupted), or now if one came already; not for a signal that
        comes while the callbacks run for another."""
        self._subscribers.append(callback)
        if self.signum is not None:
            callback(self.signum)

    def on_first_signal(self, callback: Callable[[int], None]) -> None:
        """Call `callback(signum)` once, as soon as the first signal comes, in whatever thread
        notes it first: unlike `subscribe`, also while the main thread waits in C++ (an RPC
        shutdown), where a Python handler would not run. It must return quickly."""
        with self._lock:
            if self.signum is None:
                self._at_first_signal.append(callback)
                return
        callback(self.signum)

    def unsubscribe(self, callback: Callable[[int], None]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def _note(self, signum: int) -> None:
        """The first signal: end a process still starting, else arm the watchdog."""
        with self._lock:
            first = self.signum is None
            self.signum = self.signum or signum
            if first and self._exit_while_starting:
                # A job's process: the launcher says in one line how the job ended; what
                # the processes would print while they go (peers gone, connections closed)
                # is only an echo of it.
                silence_stderr()
            if self._exit_while_starting and (not self.running or self._done):
                self._exit_now(self.signum)
            if first and self._grace_s is not None:
                now = time.monotonic()
                self._deadline, self._hard_deadline = now + self._grace_s, now + HARD_LIMIT_S
                threading.Thread(target=self._watchdog, name="stop-watchdog",
                                 daemon=True).start()
            if first:
                for callback in self._at_first_signal:
                    callback(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._note(signum)
        if self._notifying:
            # This signal interrupted the subscribers' handling of another (Ctrl-C reaches
            # every process and the launcher forwards it again), which does its work. Calling
            # them inside themselves waited forever on a lock the interrupted call held (the
            # workers' stop event's, in Trainer.request_stop).
            return
        self._notifying = True
        try:
            for callback in list(self._subscribers):
                callback(signum)  # may raise into the interrupted code (Trainer.request_stop)
        finally:
            self._notifying = False


def watch_signals(on_signal: Callable[[int], None]) -> None:
    """Call `on_signal` (in a thread) as soon as SIGINT or SIGTERM arrives. Python runs a
    signal handler only when the main thread is back in Python code; a process waiting in C++
    (a rendezvous, an RPC barrier) would never see it. The C-level handler also writes the
    signal's number to a pipe at once: a thread acts on that. (Main thread only; the signals
    need Python handlers, which may do nothing.)"""
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            for signum in os.read(read, 64):
                if signum in SIGNALS:
                    on_signal(signum)

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()


# Where a job's processes write their standard error once it is silenced (to see what a stop
# did: run with -v and this set to a file); /dev/null if unset.
QUIET_STDERR_ENV = "SHADOWSYNC_QUIET_STDERR_TO"


def silence_stderr() -> None:
    """Point this process's standard error (file descriptor 2, where torch's C++ code writes)
    at /dev/null (or the file `SHADOWSYNC_QUIET_STDERR_TO` names, appending)."""
    target = os.open(os.environ.get(QUIET_STDERR_ENV) or os.devnull,
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, 2)
    os.close(target)


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Standard error (file descriptor 2) at /dev/null inside, as it was after."""
    sys.stderr.flush()
    saved = os.dup(2)
    silence_stderr()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


# One per process.
STOP = StopRequest()


def install_in_job_process() -> None:
    """In a process the local launcher started (its environment says so), take over the
    signals before anything slow is imported (see the module's docstring), and end with the
    process that started it."""
    if os.environ.get(JOB_PROCESS_ENV) and not STOP.installed:
        STOP.install(grace_s=STOP_GRACE_S, exit_while_starting=True)
        watch_parent()


_WATCHING = False


def watch_parent() -> None:
    """Exit quietly when the process that started this one is gone (even if it was
    SIGKILLed, or died while this one was still starting), so no process outlives its job."""
    global _WATCHING
    if _WATCHING:
        return
    _WATCHING = True
    # A process forked by a fork server is that server's child; the process that asked for
    # it (a trainer, the launcher) is known to multiprocessing, by a pipe that closes with it.
    started_by = multiprocessing.parent_process()
    parent = os.getppid()

    def watch() -> None:
        while True:
            if started_by is not None:
                started_by.join(0.5)
                gone = not started_by.is_alive()
            else:
                time.sleep(0.5)
                gone = os.getppid() != parent
            if gone:
                silence_stderr()
                os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
