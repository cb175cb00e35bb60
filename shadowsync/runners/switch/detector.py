"""The straggler detector of Sync-Switch's online policies (Li, Mangoubi, Xu, Guo, ICDCS 2021,
arXiv 2104.08364): which trainers are transient stragglers right now.

Fed with each trainer's step times (`machine.SwitchMachine.pace`): the time a worker spends
between getting its parameters and pushing its gradient, plus its previous round trip less
the time the server held its gradient for a BSP step's others, so what BSP makes a trainer
wait for the others is not counted, while a slow link is; the same measure under BSP and ASP.
Every `window` steps of a trainer close one of its windows, whose median (`window_pace`) is
compared with the median of the other trainers' latest window medians (the others: with two
trainers a median over both would hide a straggler). A trainer slower than `k` x that median
for `m` consecutive windows of its own is a straggler; it stops being one after `m`
consecutive windows at or under `k` x the median. A window's median, not its mean: a
straggler slows every step, while one step a shared machine stalls (the scheduler, a
collection, a page fault) would lift a mean over k on its own.

Defaults: k = 1.5, m = 3, window = 5 steps, chosen so that an injected 3x slowdown is seen
after 15 of the straggler's steps while the step-time noise of a shared machine (about
+-30% here) never is.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch

from shadowsync.spec.detector import DetectorConfig


@dataclass
class _Track:
    pending: list[float] = field(default_factory=list)
    latest: float | None = None  # pace of the last closed window
    over: int = 0  # consecutive windows over k x median
    under: int = 0  # consecutive windows at or under it
    straggling: bool = False
    windows: int = 0  # windows judged (the false-alarm rate's denominator)
    slow_windows: int = 0


def window_pace(steps: list[float]) -> float:
    """What a window of step times says of a trainer's pace."""
    return statistics.median(steps)


class StragglerDetector:
    def __init__(self, cfg: DetectorConfig | None = None) -> None:
        self.cfg = cfg or DetectorConfig()
        self.tracks: dict[int, _Track] = {}

    def observe(self, trainer: int, compute_s: float) -> bool:
        """Take one step time of `trainer`; True when this changed who is a straggler."""
        t = self.tracks.setdefault(trainer, _Track())
        t.pending.append(compute_s)
        if len(t.pending) < self.cfg.window:
            return False
        t.latest, t.pending = window_pace(t.pending), []
        others = [o.latest for i, o in self.tracks.items() if i != trainer
                  and o.latest is not None]
        if not others:
            return False
        slow = t.latest > self.cfg.k * statistics.median(others)
        t.windows, t.slow_windows = t.windows + 1, t.slow_windows + slow
        t.over, t.under = (t.over + 1, 0) if slow else (0, t.under + 1)
        was = t.straggling
        if not was and t.over >= self.cfg.m:
            t.straggling = True
        elif was and t.under >= self.cfg.m:
            t.straggling = False
        return t.straggling != was

    @property
    def stragglers(self) -> list[int]:
        return sorted(i for i, t in self.tracks.items() if t.straggling)

    # -- checkpoints: every trainer's windows and its counts of windows judged and judged
    # slow (elastic's false-alarm rate), as tensors --
    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, t in self.tracks.items():
            latest = float("nan") if t.latest is None else t.latest
            out[f"track{i}"] = torch.tensor([latest, t.over, t.under, float(t.straggling),
                                             t.windows, t.slow_windows], dtype=torch.float64)
            out[f"pending{i}"] = torch.tensor(t.pending, dtype=torch.float64)
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.tracks = {}
        for key, value in state.items():
            if key.startswith("track"):
                i = int(key.removeprefix("track"))
                # a checkpoint from before the counts were kept has four entries
                latest, over, under, straggling, windows, slow = [*value.tolist(), 0, 0][:6]
                self.tracks[i] = _Track(
                    [float(x) for x in state.get(f"pending{i}", torch.zeros(0)).tolist()],
                    None if math.isnan(latest) else latest, int(over), int(under),
                    bool(straggling), int(windows), int(slow))
