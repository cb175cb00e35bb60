"""`bench sync`'s split of EPS into what an example costs the workers and the cores they held."""

from __future__ import annotations

import pytest

from shadowsync.bench.common import ratio_of_medians
from shadowsync.bench.sync import cpu_split


def test_eps_is_examples_per_worker_cpu_second_times_the_cores_the_workers_held():
    # 500,000 examples at 100,000 EPS: 5 s of training, in which the workers spent 9 CPU s
    s = cpu_split(100_000.0, 500_000, 9.0)
    assert s["worker_cores"] == pytest.approx(9.0 / 5.0)
    assert s["examples_per_cpu_s"] == pytest.approx(500_000 / 9.0)
    assert s["examples_per_cpu_s"] * s["worker_cores"] == pytest.approx(100_000.0)
    assert cpu_split(100_000.0, 500_000, 0.0) == {"examples_per_cpu_s": None,
                                                  "worker_cores": None}


def test_a_sync_that_takes_cores_and_one_that_costs_cpu_an_example_show_apart():
    """s-ma's shadow thread takes 2% of the cores (the workers hold 1.96 of 2), and its
    writes cost the workers 1% more CPU an example: its EPS ratio is the product."""
    runs = []
    for r, jitter in enumerate((0.98, 1.0, 1.03)):  # the machine's pace, repeat by repeat
        for variant, cores, cpu_us in (("none", 2.0, 17.0), ("s-ma", 1.96, 17.0 * 1.01)):
            eps = jitter * cores / (cpu_us * 1e-6)
            examples = 500_000
            runs.append({"variant": variant, "repeat": r, "eps": eps,
                         **cpu_split(eps, examples, examples * cpu_us * 1e-6 / jitter)})
    eps_ratio, _ = ratio_of_medians(runs, "s-ma", "none", "eps")
    cores_ratio, _ = ratio_of_medians(runs, "s-ma", "none", "worker_cores")
    cpu_ratio, _ = ratio_of_medians(runs, "s-ma", "none", "examples_per_cpu_s")
    assert cores_ratio == pytest.approx(0.98)
    assert cpu_ratio == pytest.approx(1 / 1.01)
    assert eps_ratio == pytest.approx(cores_ratio * cpu_ratio)
