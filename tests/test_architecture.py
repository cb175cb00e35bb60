"""docs/architecture.md's "Where to add X" table names files and registries that exist: each
file, and each registry name (`MODES`, `SOURCES`...) defined in the file the table names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def _rows() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8").split("## Where to add X", 1)[1]
    table = re.search(r"\| to add \|.*?\n\|---.*?\n((?:\|.*\|\n)+)", text)
    assert table, "no table under 'Where to add X'"
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.group(1).splitlines()]


def test_where_to_add_names_what_exists():
    rows = _rows()
    assert len(rows) >= 6
    for _, write, register in rows:
        for cell in (write, register):
            paths = re.findall(r"`(shadowsync/[\w/.]+)`", cell)
            assert paths, f"no path in {cell!r}"
            for path in paths:
                assert (ROOT / path).exists(), f"{path} does not exist"
        # Each registry name is defined in the file named after it ("`A` in `x.py` and `B`
        # in `y.py`").
        names: list[str] = []
        for token in re.findall(r"`([A-Z_]{4,}|shadowsync/[\w/.]+)`", register):
            if not token.startswith("shadowsync/"):
                names.append(token)
            elif token.endswith(".py"):
                source = (ROOT / token).read_text()
                for name in names:
                    assert re.search(rf"^{name}\b.*=", source, re.M), \
                        f"{name} is not defined in {token}"
                names = []
        assert not names, f"{names} name no file after them in {register!r}"
