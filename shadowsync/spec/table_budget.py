"""`--evict` (how full dynamic tables make room: `Eviction`) and `--table-memory` (their
budget in bytes: `TableMemory`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shadowsync.errors import UserError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}


@dataclass(frozen=True)
class Eviction:
    """How full pools make room: `lru` alone, or also expire rows idle `ttl` examples."""

    ttl: int | None = None

    @classmethod
    def parse(cls, text: str) -> Eviction:
        """'lru' or 'ttl:N' (N examples > 0)."""
        text = str(text).strip()
        if text == "lru":
            return cls()
        kind, _, n = text.partition(":")
        if kind == "ttl" and n.isdigit() and int(n) > 0:
            return cls(int(n))
        raise UserError(f"--evict: {text!r} is not lru or ttl:N (N examples > 0)")

    @property
    def text(self) -> str:
        return "lru" if self.ttl is None else f"ttl:{self.ttl}"

    def __str__(self) -> str:
        return self.text


LRU = Eviction()


@dataclass(frozen=True)
class TableMemory:
    """The job's dynamic-table budget in bytes: `2GiB`, `500MB`, `1000000` (rows, optimizer
    state and id maps together)."""

    bytes: int
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> TableMemory:
        written = str(text).strip()
        lower = written.lower()
        number = lower.rstrip("kmgib")
        try:
            value = float(number) * _UNITS[lower[len(number):]]
        except (KeyError, ValueError):
            value = -1
        if not value > 0:
            raise UserError(f"--table-memory: {written!r} is not a size such as 2GiB or 500MB")
        return cls(int(value), written)

    def __str__(self) -> str:
        return self.text or str(self.bytes)
