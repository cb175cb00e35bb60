"""Sync-Switch's online policy driving background synchronization (beyond the paper, which
switched only between BSP and ASP): a job on S-MA or S-BMUF, whose every round needs every
trainer, moves to S-EASGD, which talks only to the centre on the dense servers, while the
straggler detector sees a slow trainer, and back once it clears.

The detector (`detector`) is the one the protocol policies use, fed with the pace (median
step time) of each `window` consecutive steps of a trainer's workers (`chunks`): a trainer is
a straggler after `m` consecutive such paces slower than `k` x the median of the others'
latest, and stops being one after `m` at or under it. Every trainer feeds the same detector
with the same numbers (each round shares every trainer's new paces), so all of them decide
the same rule for the same round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shadowsync.runners.switch.detector import DetectorConfig, StragglerDetector, window_pace

FALLBACK = "easgd"


class BackgroundFallback:
    def __init__(self, primary: str, detector: DetectorConfig | None = None,
                 fallback: str = FALLBACK) -> None:
        cfg = detector or DetectorConfig()
        self.window = cfg.window  # steps per observation, summarized before they are shared
        self.detector = StragglerDetector(replace(cfg, window=1))
        self.primary = primary
        self.fallback = fallback
        self.rule = primary

    def decide(self, paces: Sequence[Sequence[float]]) -> str:
        """The rule of the next round, from each trainer's new observations since the last
        round (in trainer order; 0 marks an empty slot)."""
        for trainer, values in enumerate(paces):
            for pace in values:
                if pace > 0:
                    self.detector.observe(trainer, pace)
        self.rule = self.fallback if self.detector.stragglers else self.primary
        return self.rule

    def chunks(self, steps: list[float], slots: int) -> tuple[list[float], list[float]]:
        """Up to `slots` paces of `window` consecutive step times (`window_pace`; 0 in unused
        slots), and the steps left over for the next round."""
        n = min(slots, len(steps) // self.window)
        paces = [window_pace(steps[i * self.window:(i + 1) * self.window]) for i in range(n)]
        return paces + [0.0] * (slots - n), steps[n * self.window:]

    @property
    def stragglers(self) -> list[int]:
        return self.detector.stragglers
