"""Criteo display-ads TSV (`shadowsync.data.criteo`): a file, a .gz or a directory of them,
converted once into a binary cache; the source of any path no other source claims."""

from __future__ import annotations

import json
from pathlib import Path

from shadowsync.data import criteo
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.sources.base import CriteoColumns, first_rows
from shadowsync.metrics.ctr import binary_entropy


class CriteoSource(CriteoColumns):
    name = "criteo"

    def claims(self, path: str, schema: str | None) -> bool:
        return True

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        parsed = criteo.load(path, skip_bad_lines=skip_bad_lines)
        return first_rows(CtrData(parsed.labels, parsed.dense, parsed.cats, source=path,
                                  skipped_lines=parsed.skipped_lines,
                                  teacher_ne_hint=teacher_hint(path)), examples)


def teacher_hint(path: str) -> float | None:
    """Teacher NE from a ``teacher.json`` written by ``synth.write_tsv_dataset``, if any.

    For a directory of several listed files the NE is pooled from their log losses and
    click rates; any data file the summary does not list means no hint.
    """
    p = Path(path)
    summary = (p if p.is_dir() else p.parent) / "teacher.json"
    try:
        listed = json.loads(summary.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    names = [real.name for real, _ in criteo.list_sources(path)]
    if not names or any(name not in listed for name in names):
        return None
    entries = [listed[name] for name in names]
    if len(entries) == 1:
        ne = entries[0].get("ne")
        return float(ne) if ne is not None else None
    try:
        rows = sum(e["examples"] for e in entries)
        loss = sum(e["logloss"] * e["examples"] for e in entries) / rows
        ctr = sum(e["mean_ctr"] * e["examples"] for e in entries) / rows
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    h = binary_entropy(ctr)
    return loss / h if h > 0 else None
