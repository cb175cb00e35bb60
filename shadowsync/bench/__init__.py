"""Benchmarks: side-by-side runs in one process tree, medians of interleaved repeats.

Every benchmark writes DIR/bench.json as {"runs": [...raw runs...], "ratios": {...}} and prints
a table; claims about speed live here, never in timed unit tests.
"""
