"""`--data synthetic`: planted-teacher rows (`shadowsync.data.synth`), generated on first use
into a cache of `.npy` files that every process then maps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shadowsync.data import synth
from shadowsync.data.cache import built_once, cache_root
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.sources.base import CriteoColumns

SYNTHETIC = "synthetic"
DEFAULT_EXAMPLES = 1_000_000


def cache_dir(examples: int, seed: int) -> Path:
    return cache_root() / f"synth-{examples}-{seed}-v{synth.SYNTH_VERSION}"


class SyntheticSource(CriteoColumns):
    name = SYNTHETIC
    generated = True

    def claims(self, path: str, schema: str | None) -> bool:
        return path == SYNTHETIC

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        """`examples` rows (default 1,000,000) of the teacher drawn from `seed`."""
        examples = examples or DEFAULT_EXAMPLES

        def build(tmp: Path) -> None:
            data = synth.generate(examples, seed)
            for name in ("labels", "dense", "cats", "probs"):
                np.save(tmp / f"{name}.npy", getattr(data, name))
            meta = {"generator": "shadowsync planted teacher", "version": synth.SYNTH_VERSION,
                    "examples": examples, "seed": seed, "mean_ctr": data.mean_ctr,
                    "teacher_ne": data.teacher_ne()}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

        cache = built_once(cache_dir(examples, seed), "meta.json", build)
        cached = {n: np.load(cache / f"{n}.npy", mmap_mode="r")
                  for n in ("labels", "dense", "cats", "probs")}
        return CtrData(cached["labels"], cached["dense"], cached["cats"], source=SYNTHETIC,
                       probs=cached["probs"])
