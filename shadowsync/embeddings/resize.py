"""A saved dynamic-table holder laid into a pool of another size: the next day's run with a
new budget (``--warm-start`` with another ``--table-memory`` or ``--table-size``).

The ids the saved pool held keep their rows (vector and Adagrad sum), the most recently used
first, as many as the new pool holds: the rest are evicted, as the new budget requires, and
counted so. They take rows 1..k of the new pool, whose other rows stay as drawn. The clock
and the counters carry on; the admission sketch starts afresh unless it has the same shape
(its width follows the pool).
"""

from __future__ import annotations

import numpy as np
import torch

from shadowsync.embeddings.dynamic import _COUNTED, _FIRST_COUNTER, _FREE_TOP, COUNTERS, FREE


def resized_state(saved: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """`saved` (a holder's `state_dict`: ``weight``, ``adagrad``, ``map/...``) in the shapes
    of `fresh` (the new holder's `state_dict` as built: rows drawn, the map empty)."""
    out = {k: v.clone() for k, v in fresh.items()}
    capacity = len(out["map/row_key"]) - 1
    row_key, last_used = saved["map/row_key"].numpy(), saved["map/last_used"].numpy()
    live = np.flatnonzero(row_key != FREE)
    kept = torch.from_numpy(live[np.argsort(-last_used[live], kind="stable")[:capacity]])
    rows = torch.arange(1, len(kept) + 1)
    for name in ("weight", "adagrad", "map/row_key", "map/last_used"):
        if name in out and name in saved:
            out[name][rows] = saved[name][kept].to(out[name].dtype)
    meta = out["map/meta"]
    meta.copy_(saved["map/meta"][:len(meta)])  # the clock, the counters
    meta[_FREE_TOP] = capacity - len(kept)  # the free stack as built: rows 1..k taken
    meta[_FIRST_COUNTER + COUNTERS.index("evicted")] += len(live) - len(kept)
    if saved["map/sketch"].shape == out["map/sketch"].shape:
        out["map/sketch"].copy_(saved["map/sketch"])
    else:
        meta[_COUNTED] = 0
    return out
