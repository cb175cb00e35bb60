"""Injected stragglers, for tests and benchmarks: `--straggler trainer=ID,slowdown=3,start=S,
duration=D` makes every worker of one trainer take `slowdown` times its own normal step time
from S to S + D seconds after training started. This is the transient compute straggler of
Sync-Switch's online policies (Li et al., ICDCS 2021, arXiv 2104.08364).

Kinds (`kind=`, one module each in `spec.straggler_kinds`): `compute` (the default), as
above; `delay`, a slow link behind some trainers; `jitter`, a slow shared network.
`trainers=N` slows the last N trainers (`trainer=ID` one); `episodes=K` cuts the window into
K equal episodes with K - 1 equal breaks between them (`spec.delay.in_episode`), so an
online policy must also switch back.

With `start=25%,duration=50%` the window is a share of the job instead: it opens when a
quarter of the job's examples are trained and closes at three quarters, whatever the clock
says, so every protocol meets the straggler over the same stretch of work ("the middle half
of the run") however fast it gets there. Progress is the job's (under bsp, asp and switch
the gradients the dense servers have applied against the budget, the same for every
trainer), else the worker's own steps against its planned steps.

A step's time here is the whole step as the worker lives it: its compute and its
synchronization (under BSP a step's push waits for the slowest trainer; that wait is part of
the job's normal pace). The normal step time is the median of the worker's steps before the
window opens, frozen there: the straggler sleeps after each step of the window until the
step has taken `slowdown` x that reference, so a 3x straggler makes a BSP job's steps 3x
longer. Holding only the compute to 3x would not: with a step mostly spent in its push, the
job would barely notice. Measuring the slowdown against each slowed step's own time instead
of a frozen reference would drift on a machine with fewer cores than processes: while the
straggler sleeps, the others get its CPU, its own next step runs faster, and the sleep
shrinks with it.

This module is the option (`Straggler`, parsed once by the configuration); the injection
itself is `shadowsync.train.straggler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shadowsync.errors import UserError
from shadowsync.spec.delay import LinkDelay, in_episode
from shadowsync.spec.straggler_kinds import KINDS, StragglerKind

FIELDS = ("kind", "trainer", "trainers", "slowdown", "ms", "jitter", "start", "duration",
          "episodes")


@dataclass(frozen=True)
class Straggler:
    trainer: int  # the first slowed trainer
    slowdown: float
    start: float  # seconds after the first step, or a fraction of the job with `of_job`
    duration: float
    of_job: bool = False  # start and duration are fractions of the job's examples
    kind: str = "compute"
    count: int = 1  # trainers slowed: trainer, trainer + 1, ...
    ms: float = 0.0  # delay and jitter: milliseconds added to each push
    jitter_ms: float = 0.0
    episodes: int = 1
    text: str = field(default="", compare=False)  # as written

    @staticmethod
    def parse(text: str, trainers: int) -> Straggler:
        values: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in FIELDS:
                raise UserError(f"--straggler: '{item}' must be KEY=VALUE with KEY one of "
                                f"{', '.join(FIELDS)}")
            values[key.strip()] = value.strip()
        kind = values.get("kind", "compute")
        if kind not in KINDS:
            raise UserError(f"--straggler: kind={kind} is not one of {', '.join(KINDS)}")
        slows = KINDS[kind]
        window = [values[k] for k in ("start", "duration") if k in values]
        of_job = any(v.endswith("%") for v in window)
        if of_job and not all(v.endswith("%") for v in window):
            raise UserError("--straggler: start and duration must both be seconds or both "
                            "shares of the job (25%)")
        scale = 100.0 if of_job else 1.0
        try:
            start = float(values.get("start", "0").removesuffix("%")) / scale
            duration = float(values.get("duration", "inf").removesuffix("%")) / scale
            count = int(values.get("trainers", "1"))
            first = int(values.get("trainer", str(trainers - count if "trainers" in values
                                                  else 0)))
            if slows.every_trainer:
                first, count = 0, trainers
            s = Straggler(first, float(values.get("slowdown", "3")), start, duration, of_job,
                          kind, count, float(values.get("ms", "0")),
                          float(values.get("jitter", "0")), int(values.get("episodes", "1")),
                          text)
        except ValueError:
            raise UserError(f"--straggler: '{text}' has a value that is not a number") from None
        if count < 1 or not 0 <= s.trainer or s.trainer + count > trainers:
            raise UserError(f"--straggler: trainer={s.trainer} is not in [0, {trainers})"
                            if count == 1 else f"--straggler: trainers={count} needs at least "
                            f"{count} trainers from trainer {s.trainer} on")
        if not s.slowdown >= 1 or s.start < 0 or not s.duration > 0:
            raise UserError("--straggler: needs slowdown >= 1, start >= 0 and duration > 0")
        if s.episodes < 1 or s.ms < 0 or s.jitter_ms < 0:
            raise UserError("--straggler: needs episodes >= 1, ms >= 0 and jitter >= 0")
        if slows.delays_pushes and s.ms <= 0:
            raise UserError(f"--straggler: kind={kind} needs ms > 0 (the delay of each push)")
        return s

    @property
    def slows(self) -> StragglerKind:
        """The kind's entry (`spec.straggler_kinds`)."""
        return KINDS[self.kind]

    @property
    def trainers(self) -> tuple[int, ...]:
        return tuple(range(self.trainer, self.trainer + self.count))

    def at(self, since_start_s: float, progress: float) -> float:
        """Where the job is on the window's scale: seconds, or the fraction of the job."""
        return progress if self.of_job else since_start_s

    def active(self, trainer: int, at: float) -> bool:
        return trainer in self.trainers and in_episode(at, self.start, self.duration,
                                                       self.episodes)

    def link(self) -> LinkDelay | None:
        """The delay a network kind adds to the pushes (`transport.delay`)."""
        if not self.slows.delays_pushes:
            return None
        return LinkDelay(self.trainers, self.ms, self.jitter_ms, self.start, self.duration,
                         self.episodes, self.of_job)

    def __str__(self) -> str:
        return self.text
