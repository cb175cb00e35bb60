"""What switching cost a run, two ways.

- The paper's way (Li, Mangoubi, Xu, Guo, ICDCS 2021, arXiv 2104.08364; its abstract: "the
  framework overhead can be as low as 1.7% of the total training time"): the share of the
  run's wall time spent switching, `share = sum(switch_s) / train_s`, where a switch's
  `switch_s` is the time from the decision to the first step under the new protocol applied,
  less that step's own time, compute and round trip (measured on the dense server by
  `machine.SwitchMachine`).
  Their switch was a checkpoint, a kill and a restart (minutes); ours is in place.
- Per switch, as a worker lives it (`latency_s`, each switch's `cost_s`): how much longer its
  first push under the new protocol took than a typical push before it. BSP -> ASP costs a
  worker nothing by this measure; ASP -> BSP costs the wait for the slowest worker to join.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def switch_overhead(switches: Sequence[dict[str, Any]], train_s: float) -> dict[str, Any]:
    """`switches`: a run's summary entries (`switch_s` where the server measured it)."""
    spent = [float(w["switch_s"]) for w in switches if w.get("switch_s") is not None]
    total = sum(spent)
    return {"switches": len(switches), "switch_s": spent, "switch_s_total": total,
            "share_of_run": total / train_s if train_s > 0 else None,
            "latency_s": [w.get("cost_s") for w in switches]}
