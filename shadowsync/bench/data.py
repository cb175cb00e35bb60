"""`shadowsync bench data`: how fast text becomes the binary cache, and how fast batches come
out of it, against how fast training consumes them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from shadowsync.bench.common import interleaved, median_of, print_table, write_bench


def run_data_bench(out: str, lines: int = 500_000, repeats: int = 3,
                   training_eps: float = 130_000.0) -> dict[str, Any]:
    from shadowsync.data.criteo import bench_conversion

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
