"""The elastic online policy of Sync-Switch (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv
2104.08364; its timing policy, the online part for transient stragglers): ride out what is
short, switch for what lasts.

    mode(t) = ASP  if a straggler has been detected without a break since s, t - s >= P,
                   or B(t) >= Q
              BSP  otherwise

with B(t) and Q as in `greedy` and P the patience. A slowdown the detector clears within P
costs no switch at all (greedy pays two), a lasting one is left for ASP once it has lasted P,
and when the detector clears the policy returns to BSP at once while the quota is not done.

The patience (`--switch-patience` seconds, else derived while the job runs):

    P = max(2 C / (1 - 1/k),  m w t ceil(ln e / ln(m a)))

- 2 C / (1 - 1/k): a straggler the detector flags is at least k x slower, so under BSP it
  costs at least (1 - 1/k) of each second it lasts; leaving for ASP and coming back costs two
  switches of C seconds each. A slowdown shorter than 2 C / (1 - 1/k) costs more in switches
  than it saves. C = `SWITCH_COST_S`, the longest time a switch took the job (`switch_s`) in
  the runs of `bench switch` here; the paper's checkpoint-and-restart switch took 2.6-3.8
  minutes, which would make P 16-23 minutes at k = 1.5.
- m w t ceil(ln e / ln(m a)): how long a false alarm stays flagged. Once flagged, a trainer is
  cleared after m windows of w of its own steps at a normal pace, m w t seconds with t the
  job's BSP step time: while elastic waits out its patience the job is in BSP, where every
  trainer steps at the pace of the step, which waits for the slowest. t is measured as the
  median of the last `TIMED_STEPS` intervals between the BSP steps the policy decided after
  (the server asks it once a BSP step). The trainers' median pace instead was about 2/3 of
  that on a loaded machine here, and made elastic leave BSP for `bench switch`'s false
  alarm. With a the detector's
  false-alarm rate (the share of a normal trainer's windows judged slow: the median over the
  trainers not flagged now of their slow windows' share, at least `FALSE_ALARM_FLOOR`), a
  run of m windows fails to clear it with chance about m a, so n such runs outlast all but
  (m a)^n of false alarms: n = ceil(ln e / ln(m a)) leaves e = `MISSED_FALSE_ALARMS` of
  them. At the floor (a = 1%, m = 3) n = 2.

An alarm keeps the patience it was raised with: the rule's inputs move while the job runs
(under ASP the steps are shorter), and a patience that grew during an alarm would send a job
that had left for ASP back to BSP with the straggler still there.

The false-alarm rate also says when elastic beats greedy: greedy pays 2 C per false alarm,
elastic P (1 - 1/k) per real straggler; the derived P makes elastic ignore false alarms.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from shadowsync.protocols import Protocol
from shadowsync.runners.switch.detector import StragglerDetector
from shadowsync.runners.switch.policy import PolicySetup, Progress, Whole

SWITCH_COST_S = 0.009  # C: bench switch's default runs here measured switch_s 4.2-8.6 ms
FALSE_ALARM_FLOOR = 0.01  # a: never assumed lower than this
MISSED_FALSE_ALARMS = 0.01  # e: the share of false alarms the patience may let through
TIMED_STEPS = 25  # t: the median over this many of the latest BSP steps


def derived_patience_s(step_s: float, false_alarm_rate: float, k: float, m: int, window: int,
                       switch_s: float = SWITCH_COST_S) -> float:
    """P of the module's rule."""
    repay = 2 * switch_s / (1 - 1 / k)
    alarm = max(FALSE_ALARM_FLOOR, false_alarm_rate) * m
    runs = 1 if alarm >= 1 else max(1, math.ceil(math.log(MISSED_FALSE_ALARMS)
                                                 / math.log(alarm)))
    if alarm >= 1:  # every window looks slow: no patience outlasts that; wait for the repay
        return repay
    return max(repay, m * window * step_s * runs)


class Elastic(Whole):
    name = "elastic"
    detects = True

    def __init__(self, quota: int, patience_s: float | None = None,
                 detector: StragglerDetector | None = None) -> None:
        """`patience_s` None: derived from `detector`'s observations (see the rule)."""
        self.quota = quota
        self.fixed_patience_s = patience_s
        self.detector = detector
        self._since: float | None = None  # when the current straggler was first seen
        self._alarm_patience_s = 0.0  # the patience when it was
        self._bsp_since: float | None = None  # the last decision, while it was BSP
        self._bsp_steps: deque[float] = deque(maxlen=TIMED_STEPS)  # seconds a BSP step

    @classmethod
    def build(cls, setup: PolicySetup) -> Elastic:
        return cls(setup.quota, setup.patience_s, setup.detector)

    @property
    def patience_s(self) -> float:
        if self.fixed_patience_s is not None or self.detector is None:
            return self.fixed_patience_s or 0.0
        d, cfg = self.detector, self.detector.cfg
        flagged = set(d.stragglers)
        step_s = statistics.median(self._bsp_steps) if self._bsp_steps else 0.0
        shares = [t.slow_windows / t.windows for i, t in d.tracks.items()
                  if i not in flagged and t.windows]
        rate = statistics.median(shares) if shares else 0.0
        return derived_patience_s(step_s, rate, cfg.k, cfg.m, cfg.window)

    def mode(self, at: Progress) -> Protocol:
        """Asked after every BSP step while the job is in BSP (after every push under ASP)."""
        stragglers, bsp_applied, now = bool(at.stragglers), at.bsp_applied, at.now
        if self._bsp_since is not None:  # one BSP step since the last decision
            self._bsp_steps.append(now - self._bsp_since)
        if not stragglers:
            self._since = None
        elif self._since is None:
            self._since, self._alarm_patience_s = now, self.patience_s
        lasting = self._since is not None and now - self._since >= self._alarm_patience_s
        mode = Protocol.ASP if lasting or bsp_applied >= self.quota else Protocol.BSP
        self._bsp_since = now if mode is Protocol.BSP else None
        return mode
