"""Raw-id CTR data: Zipf-distributed 63-bit ids over a huge id space, drifting day by day.

What dynamic embedding tables are for, with a known answer: each of `features` categorical
features draws an item by popularity rank r from a Zipf-like law over `vocab` ranks (density
proportional to (r + 1)^-s, sampled by inverting its continuous CDF), and writes the item as
a raw id, ``mix64(code) mod 2^63`` of a code naming (feature, item): ids look like production
hashes and a table cannot index them directly. Each day a share `drift` of every rank's items
is replaced by items new that day (the same ranks, so new ids are as popular as the ones
they replace), the rest keep their id: the ids of day d and day d + 1 overlap by about
1 - drift of their traffic.

The click probability is ``sigmoid(b + a * (sum_f bias(f, item_f) / sqrt(F) + w . dense))``
with bias(f, item) ~ N(0, 1) drawn from a hash of the item (no table of 10^7 biases is
stored) and two dense features ~ N(0, 1). Each row's probability is written beside it
(``probs.npy``): its log loss on the labels is the teacher's NE, the floor of any model.
Rows are drawn in blocks seeded by (seed, day, block), so a day's file is the same whatever
the size of the others.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shadowsync.data.ids import mix64
from shadowsync.metrics.ctr import normalized_entropy

BLOCK_ROWS = 1 << 16
_M63 = np.uint64((1 << 63) - 1)


@dataclass(frozen=True)
class ZipfConfig:
    features: int = 8
    vocab: int = 10_000_000  # popularity ranks per feature
    exponent: float = 1.05  # s of the Zipf-like law
    drift: float = 0.2  # share of each rank's items new each day
    dense: int = 2
    id_weight: float = 1.5  # a: how much the ids and dense features decide
    bias: float = -1.2  # b: sets the click rate (about 0.27 at the defaults)


def _normal_of(code: np.ndarray) -> np.ndarray:
    """A standard normal per item code, the same wherever it is drawn (Box-Muller)."""
    u1 = (mix64(code ^ np.uint64(0x1234567)) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    u2 = (mix64(code ^ np.uint64(0x7654321)) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * np.pi * u2)


def item_codes(cfg: ZipfConfig, ranks: np.ndarray, day: int) -> np.ndarray:
    """The code of the item at each [row, feature] rank on `day`: a stable item, or (for a
    `drift` share of the ranks, chosen anew each day) one of that day's new items."""
    f = np.arange(cfg.features, dtype=np.uint64)
    with np.errstate(over="ignore"):
        stable = (ranks.astype(np.uint64) << np.uint64(8)) | f
        fresh_code = stable ^ (np.uint64(day + 1) << np.uint64(56))
        u = (mix64(fresh_code) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.where((day > 0) & (u < cfg.drift), fresh_code, stable)


def generate_day(cfg: ZipfConfig, examples: int, day: int, seed: int
                 ) -> dict[str, np.ndarray]:
    """labels, dense, cats (raw ids) and probs of `examples` rows of `day`."""
    out = {"labels": np.empty(examples, np.float32),
           "dense": np.empty((examples, cfg.dense), np.float32),
           "cats": np.empty((examples, cfg.features), np.int64),
           "probs": np.empty(examples, np.float32)}
    w = np.random.default_rng([seed, 0xD5]).standard_normal(cfg.dense) / np.sqrt(cfg.dense)
    s = cfg.exponent
    top = (cfg.vocab + 1.0) ** (1 - s) - 1.0
    for lo in range(0, examples, BLOCK_ROWS):
        hi = min(examples, lo + BLOCK_ROWS)
        rng = np.random.default_rng([seed, day, lo // BLOCK_ROWS])
        u = rng.random((hi - lo, cfg.features))
        ranks = np.minimum((1.0 + u * top) ** (1.0 / (1 - s)) - 1.0, cfg.vocab - 1).astype(np.int64)
        codes = item_codes(cfg, ranks, day)
        dense = rng.standard_normal((hi - lo, cfg.dense))
        score = _normal_of(codes).sum(1) / np.sqrt(cfg.features) + dense @ w
        p = 1.0 / (1.0 + np.exp(-(cfg.bias + cfg.id_weight * score)))
        out["labels"][lo:hi] = rng.random(hi - lo) < p
        out["dense"][lo:hi] = dense
        out["cats"][lo:hi] = (mix64(codes ^ np.uint64(seed)) & _M63).view(np.int64)
        out["probs"][lo:hi] = p
    return out


def write_days(out: str | Path, examples: int, days: int = 1, seed: int = 0,
               config: ZipfConfig | None = None) -> dict:
    """OUT/day0, OUT/day1...: array directories (labels, dense, cats, probs .npy) of
    `examples` rows each, and OUT/zipf.json with the settings and each day's teacher NE on
    its last 10% (where `train` evaluates when given no --eval-data)."""
    cfg = config or ZipfConfig()
    root = Path(out)
    info: dict = {"generator": "shadowsync zipf ids", "config": asdict(cfg), "seed": seed,
                  "examples": examples, "days": {}}
    for day in range(days):
        d = generate_day(cfg, examples, day, seed)
        where = root / f"day{day}"
        where.mkdir(parents=True, exist_ok=True)
        for name, arr in d.items():
            np.save(where / f"{name}.npy", arr)
        tail = slice(examples - examples // 10, examples)
        info["days"][f"day{day}"] = {
            "mean_ctr": float(d["labels"].mean()),
            "teacher_eval_ne": normalized_entropy(d["probs"][tail].astype(np.float64),
                                                  d["labels"][tail].astype(np.float64)),
            "distinct_ids": int(len(np.unique(d["cats"]))),
        }
    (root / "zipf.json").write_text(json.dumps(info, indent=2))
    return info
