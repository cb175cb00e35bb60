"""The Sync-Switch state machine of one tensor trained on the dense servers: progress, phases,
the protocol of the next step, who is isolated, what each switch cost, and the rewind of a
resumed job. Pure: plain numbers in, a decision out; no processes, no threads, no RPC. The
dense server (`transport.servers.dense`) holds the parameters, applies the gradients and
calls this under its lock.

With n the job's workers, A(t) the gradients applied, B(t) those applied under BSP, Q the
budget of gradients and P the phase being applied:

- progress: an ASP gradient adds 1 to A; a BSP step of m gradients (m = n - k w, k trainers
  of w workers each isolated, the step formed by trainer id from the others) adds m to A and
  to B. The job is done when A >= Q > 0 or it
  was stopped.
- decide (between steps only, never while a BSP step is half collected, never when done):
  the schedule names the protocol from (A, B); a decision that differs from the last one, or
  a change in the isolated trainers, is a switch: the phase index goes up by one. While the
  decision is BSP, a decision is taken only when a BSP step is done, where every member of
  the step hears it in the step's reply: after a switch into BSP an ASP gradient still in
  flight must not flip it back (a worker told to join would wait for others told to leave),
  and an isolated trainer's ASP push must not change who is isolated while the members
  compute the next step (a member isolated then would push a gradient its step no longer
  counts).
- shards: only shard 0's machine has a schedule and decides; the others are its followers
  (`follower`), counting progress from the same pushes, whose BSP steps are formed from the
  isolated trainers each push names (what shard 0 told its worker).
- phases: a push of phase p > P enters phase p (its momentum reset is the server's); the
  switch's entry gets the parameters' version and the time the entry took the server.
- switch time: from the decision to the first step of the new phase applied, less that
  step's own time as a step without a switch would take it, its pace (below; the longest
  among a BSP step's gradients):
      switch_s = max(0, t_applied - t_decided - pace)
  What is left is what the switch added: into BSP the wait for the workers still finishing
  an ASP step, a momentum reset. Less the compute alone, it also counted the step's own
  round trip (the reply carrying the decision and the push: a few ms a switch here, 30 ms
  more behind a delayed link), which every step pays, switch or not.
- pace (what the straggler detector sees of one step): compute + the link's part of the
  trainer's previous round trip (its round trip less the time the server held its gradient
  for the step's others, 0 under ASP). The same measure under BSP and ASP, so a trainer
  isolated (pushing ASP among BSP members) is judged against the members on equal terms: a
  measure that added the round trip under ASP only (the server's work and the RPC, several
  times a digits step's compute here) kept a recovered isolated trainer over k x the
  members' pace, and it was never taken back.
- rewind: a checkpoint saved a few pushes after the workers' positions (A_saved > G, the
  gradients those positions count) restarts from A = G; under BSP also
      B = max(0, B_saved - (A_saved - G))
  so the job applies exactly its budget, and a BSP phase its share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.schedule import Schedule
from shadowsync.state_dicts import nest, part

COUNTERS = ("applied", "bsp_applied", "phase", "decided_phase", "bsp_at_switch")
ISOLATED = "isolated"


@dataclass
class SwitchMachine:
    workers: int  # every worker of the job (BSP's n with nobody isolated)
    budget: int = 0  # gradients the job applies in all; 0: no end known here
    schedule: Schedule | None = None  # decides the next protocol; None: pushes name it
    workers_per_trainer: int = 1  # the gradients a trainer gives a BSP step
    clock: Callable[[], float] = time.perf_counter  # seconds; a test may script it
    wall: Callable[[], float] = time.time  # for the switch log
    applied: int = 0
    bsp_applied: int = 0
    phase: int = 0  # the phase whose pushes are being applied (momentum reset on entry)
    mode: Protocol = Protocol.BSP  # the decision: the protocol of the next step
    decided_phase: int = 0  # and its phase index
    bsp_at_switch: int = 0  # bsp_applied when the last switch was decided
    isolated: tuple[int, ...] = ()  # `isolate`: trainers pushing ASP while the rest run BSP
    stopped: bool = False  # the job was stopped: nothing more is applied
    switches: list[dict[str, Any]] = field(default_factory=list)
    step_pace: float = 0.0  # the longest pace among the current BSP step's gradients
    after_bsp_step: bool = False  # the last thing applied was a whole BSP step

    def start(self) -> None:
        """On the server that holds the tensor, before the first push: the first protocol."""
        if self.schedule is not None:
            self.mode = Protocol(self.schedule.first_mode())

    @property
    def done(self) -> bool:
        return self.stopped or (self.budget > 0 and self.applied >= self.budget)

    @property
    def trainers(self) -> int:
        return self.workers // self.workers_per_trainer

    @property
    def bsp_workers(self) -> int:
        """Gradients a BSP step averages: every worker but the isolated trainers'."""
        return self.workers - len(self.isolated) * self.workers_per_trainer

    def follower(self) -> SwitchMachine:
        """The machine of a shard other than 0: the same job, no schedule of its own."""
        return SwitchMachine(self.workers, self.budget, None, self.workers_per_trainer,
                             clock=self.clock, wall=self.wall)

    @staticmethod
    def pace(compute_s: float, wait_s: float) -> float:
        """One step of a trainer as it would go if nobody waited for anyone (see pace);
        `wait_s`: its previous round trip less what the server held it."""
        return compute_s + wait_s

    def observe(self, trainer: int, compute_s: float, wait_s: float) -> None:
        """A push arrived: its pace goes to the schedule's straggler detector."""
        if self.schedule is not None:
            self.schedule.observe(trainer, self.pace(compute_s, wait_s))

    def enter_phase(self, phase: int, protocol: Protocol, version: int,
                    server_s: float) -> None:
        """A push of a later phase arrived; `server_s`: what entering it took the server."""
        self.phase = phase
        entry = next((sw for sw in self.switches if sw["phase"] == phase), None)
        if entry is None:  # decided elsewhere (a shard other than 0, or no schedule)
            entry = {"phase": phase, "to": Protocol(protocol).value, "wall_time": self.wall()}
            self.switches.append(entry)
        entry.update(version=version, server_s=server_s)

    def bsp_gradient(self, pace_s: float) -> None:
        """A BSP gradient is held until its step is complete; `pace_s`: its `pace`."""
        self.step_pace = max(self.step_pace, pace_s)

    def asp_applied(self, phase: int, pace_s: float) -> None:
        """An ASP gradient of `phase` was applied; `pace_s`: its `pace`."""
        self.applied += 1
        self.after_bsp_step = False
        self._first_step_done(phase, pace_s)

    def bsp_step_applied(self, gradients: int, phase: int) -> None:
        """A BSP step of `gradients` gradients of `phase` was applied."""
        self.applied += gradients
        self.bsp_applied += gradients
        self.after_bsp_step = True
        self._first_step_done(phase, self.step_pace)
        self.step_pace = 0.0

    def decide(self, bsp_waiting: int) -> None:
        """The protocol of the next step and who is isolated (see decide)."""
        if self.schedule is None or bsp_waiting or self.done:
            return
        if self.mode is Protocol.BSP and not self.after_bsp_step:
            return
        mode = Protocol(self.schedule.decide(self.applied, self.bsp_applied))
        isolated = self.schedule.isolated
        if mode is self.mode and isolated == self.isolated:
            return
        self.bsp_at_switch = self.bsp_applied
        self.switches.append({"phase": self.decided_phase + 1, "from": self.mode.value,
                              "to": mode.value, "applied": self.applied,
                              "wall_time": self.wall(), "decided_s": self.clock(),
                              "stragglers": self.schedule.stragglers,
                              "isolated": list(isolated)})
        self.isolated = isolated
        self.mode, self.decided_phase = mode, self.decided_phase + 1

    def rewind(self, gradients: int) -> None:
        """Resumed from positions that count `gradients` (see rewind)."""
        extra = self.applied - gradients
        if extra <= 0:
            return
        if self.mode is Protocol.BSP:
            self.bsp_applied = max(0, self.bsp_applied - extra)
        self.applied = gradients

    def _first_step_done(self, phase: int, pace_s: float) -> None:
        """The time a switch took the job, as the paper counts its overhead (summed into a
        share of the training time, "as low as 1.7%" with its checkpoint and restart): see
        switch time. `pace_s` is the previous round trip's link time, an estimate of this
        step's: one that came back faster would leave less than 0, counted as 0."""
        entry = next((sw for sw in reversed(self.switches) if sw["phase"] == phase), None)
        if entry is None or "decided_s" not in entry or "switch_s" in entry:
            return
        entry["switch_s"] = max(0.0, self.clock() - entry["decided_s"] - pace_s)

    # -- checkpoints: progress, the protocol decided and its phase, who is isolated (one flag
    # per trainer: a fixed shape), the schedule's own state. The budget and the schedule's
    # settings come again from the workers of the resumed run.
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {Protocol.ASP.value: int(self.mode is Protocol.ASP)}
        out.update({name: getattr(self, name) for name in COUNTERS})
        out[ISOLATED] = [int(i in self.isolated) for i in range(self.trainers)]
        if self.schedule is not None:
            out.update(nest("schedule.", self.schedule.state_dict()))
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mode = Protocol.ASP if int(state[Protocol.ASP.value]) else Protocol.BSP
        for name in COUNTERS:
            setattr(self, name, int(state[name]))
        flags = state.get(ISOLATED, ())  # absent from a checkpoint older than isolate's
        self.isolated = tuple(i for i, f in enumerate(flags) if f)  # a list or a saved tensor
        if self.schedule is not None:
            self.schedule.load_state_dict(part(state, "schedule."))
