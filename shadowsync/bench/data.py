"""`shadowsync bench data`: how fast text becomes the binary cache, and how fast batches come
out of it, against how fast training consumes them."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from shadowsync.bench.common import interleaved, median_of, print_table, write_bench
from shadowsync.data import criteo
from shadowsync.data.dataset import CtrData, batches
from shadowsync.data.synth import write_tsv_dataset


def run_data_bench(out: str, lines: int = 500_000, repeats: int = 3,
                   training_eps: float = 130_000.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shadowsync-bench-data-") as tmp:
        runs = interleaved({"convert_and_read": lambda: bench_conversion(Path(tmp), lines)},
                           repeats, "bench data")
    lines_per_s = median_of(runs, "convert_and_read", "lines_per_s")
    reader = median_of(runs, "convert_and_read", "reader_examples_per_s")
    ratios = {
        "conversion_lines_per_s": lines_per_s,
        "reader_examples_per_s": reader,
        # The fastest local training measured here (2 Hogwild workers) is about 130k/s.
        "reader_vs_training": reader / training_eps,
    }
    print_table([[k, v] for k, v in ratios.items()], ["measure", "median"])
    path = write_bench(Path(out), "data", runs, ratios, {"lines": lines, "repeats": repeats})
    print(f"wrote {path}")
    return ratios


def bench_conversion(tmpdir: str | os.PathLike, lines: int = 500_000, seed: int = 0) -> dict:
    """Measure text conversion (lines/s) and batch reading (examples/s) on synthetic lines.

    The lines come from the planted-teacher generator: 8-hex-digit categoricals, small
    counts, some empty fields, like Criteo's.
    """
    root = Path(tmpdir) / "bench-conversion"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    write_tsv_dataset(root, examples=lines, seed=seed, eval_fraction=0.0, progress=False)
    src = root / "train.tsv"
    size = src.stat().st_size
    files = criteo.list_sources(str(src))
    out = root / "cache"
    out.mkdir()
    t0 = time.perf_counter()
    meta = criteo.convert(files, out, skip_bad_lines=False, progress=False)
    conv_s = time.perf_counter() - t0
    arrays = criteo.load_cache(out, meta, True, files)
    data = CtrData(arrays.labels, arrays.dense, arrays.cats, source=str(src))
    t0 = time.perf_counter()
    seen = 0
    for dense, _cats, _labels in batches(data, 0, len(data), 1024):
        seen += len(dense)
    read_s = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return {
        "lines": lines,
        "bytes": size,
        "conversion_s": conv_s,
        "lines_per_s": lines / conv_s,
        "mb_per_s": size / conv_s / 1e6,
        "reader_examples_per_s": seen / read_s,
    }
