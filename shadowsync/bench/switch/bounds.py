"""The shortest time an online policy can take under a slowdown (`greedy_bound`), from the
run's own BSP and ASP times and the steps its detector (and elastic's patience) needs to see
the slowdown (`detection_lag_share`); each policy's time against it (`bounds_of`)."""

from __future__ import annotations

from typing import Any

from shadowsync.bench.switch.scenarios import (
    DELAYS,
    ONLINE_POLICIES,
    SLOWDOWN,
    WINDOW_LENGTH,
    waits_out_patience,
)
from shadowsync.protocols import Protocol
from shadowsync.runners.switch.elastic import derived_patience_s
from shadowsync.spec.detector import DetectorConfig


def greedy_bound(bsp_s: float, asp_s: float, workers: int, bsp_share: float,
                 slowdown: float, slowed: int = 1, window: float = WINDOW_LENGTH,
                 lag_share: float = 0.0) -> float:
    """The shortest time greedy can take when `slowed` of `workers` workers run `slowdown`
    times slower over a `window` share of the job, from the run's own straggler-free times:
    BSP's `bsp_s` and ASP's `asp_s` for the whole job.

    Best case: ASP over the window, where the others go on at full pace and the slowed ones
    at 1/slowdown, so the window's work takes w * asp_s * n / (n - k + k / s); outside it
    BSP until the quota q is done, then ASP: min(q, 1 - w) * bsp_s + max(0, 1 - w - q) *
    asp_s. With BSP and ASP equally fast (asp_s = bsp_s = 1), n = 4, one worker 3x slower
    over the middle half and q = 0.5: 0.5 + 0.5 * 4 / 3.33 = 1.1, where BSP takes 0.5 + 0.5
    * 3 = 2.0.

    A policy does not see a slowdown at once: the detector flags a trainer after m windows
    of w of its steps, so the first `lag_share` L of the window (`detection_lag_share`) runs
    BSP at the slowed pace, each step (s - 1) ASP steps longer, and counts against the
    quota:
        bound = L (bsp_s + (s - 1) asp_s) + (w - L) asp_s n / (n - k + k / s)
                + min(q', 1 - w) bsp_s + max(0, 1 - w - q') asp_s,   q' = max(0, q - L)
    (after the slowdown the detector takes as long again to clear, under ASP: those steps
    are the ASP the lower quota q' leaves outside the window). L = 0 is the best case above.
    """
    n, k, s, w = workers, slowed, slowdown, window
    lag = min(lag_share, w)
    inside = lag * (bsp_s + (s - 1) * asp_s) + (w - lag) * asp_s * n / (n - k + k / s)
    quota = max(0.0, bsp_share - lag)
    outside = min(quota, 1 - w) * bsp_s + max(0.0, 1 - w - quota) * asp_s
    return outside + inside


def detection_lag_share(policy: str, steps: float, episodes: int,
                        window: float = WINDOW_LENGTH,
                        detector: DetectorConfig | None = None) -> float:
    """The share of a job of `steps` steps a worker that `policy` runs before it acts on a
    slowdown, over all its `episodes` (each an equal part of the window's 2E - 1 slices,
    `LinkScenario.on_share`): the detector's m w steps, and elastic's patience on top (the
    derived rule at its floor, `runners.switch.elastic`: 2 m w BSP steps), each capped at
    its episode, which a slowdown shorter than the lag never leaves:
        L = E min(D, steps w / (2E - 1)) / steps,   D = m w (+ patience for elastic)"""
    detector = detector or DetectorConfig()  # the defaults the bench's jobs run with
    d = detector.m * detector.window
    if waits_out_patience(policy):
        d += derived_patience_s(1.0, 0.0, detector.k, detector.m, detector.window, 0.0)
    episode = steps * window / (2 * episodes - 1)
    return episodes * min(d, episode) / steps


def delay_slowdown(delay_s: float, asp_s: float, steps_per_worker: float) -> float:
    """A round trip `delay_s` longer as a slowdown of the worker's ASP step (its
    straggler-free step time: `asp_s` over its steps): 1 + delay / step."""
    return 1.0 + delay_s * steps_per_worker / asp_s


def bounds_of(res: dict[str, Any], suffix: str) -> dict[str, float | None]:
    """`POLICY_time_vs_bound_SCENARIO`: an online policy's time over `greedy_bound` with the
    time it waits to see the slowdown (`detection_lag_share`), and the bound itself
    (`bound_s_SCENARIO`; elastic's, longer by its patience: `elastic_bound_s_SCENARIO`),
    where the task ran BSP and ASP without a slowdown."""
    m = res["medians"]
    if not (Protocol.BSP in m and Protocol.ASP in m and "gradients" in res):
        return {}
    bsp_s, asp_s = m[Protocol.BSP]["train_s"], m[Protocol.ASP]["train_s"]
    n = res["workers"]
    steps = res["gradients"] / n
    slowdowns = {"straggler": (SLOWDOWN, 1, WINDOW_LENGTH, 1),
                 **{name: (delay_slowdown(s.ms / 1000, asp_s, steps), s.trainers, s.on_share,
                           s.episodes) for name, s in DELAYS.items()}}
    out: dict[str, float | None] = {}
    for scenario, (slowdown, slowed, window, episodes) in slowdowns.items():
        if f"bsp+{scenario}" in m and scenario in DELAYS:  # the delay as the step feels it
            out[f"step_slowdown_{scenario}{suffix}"] = slowdown
            out[f"bsp_slowdown_{scenario}{suffix}"] = m[f"bsp+{scenario}"]["train_s"] / bsp_s
        policies = [v.partition("+")[0] for v in m if v.endswith(f"+{scenario}")
                    and v.partition("+")[0] in ONLINE_POLICIES]
        for p in policies:  # each waits for the detector (`detection_lag_share`)
            lag = detection_lag_share(p, steps, episodes)
            bound = greedy_bound(bsp_s, asp_s, n, res["bsp_share"], slowdown, slowed, window,
                                 lag)
            waits = f"{p}_" if waits_out_patience(p) else ""  # elastic's own bound
            out[f"{waits}bound_s_{scenario}{suffix}"] = bound
            out[f"{p}_time_vs_bound_{scenario}{suffix}"] = m[f"{p}+{scenario}"]["train_s"] / bound
    return out
