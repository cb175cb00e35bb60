"""`--switch-at`: the BSP share of a `--sync switch` plan, a number or `auto` (what
`shadowsync switch search` stored for the job). Parsing reads no file: the job's entry
resolves `auto` once, before any process starts (`resolved`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shadowsync.errors import UserError


def parse_share(text: str) -> float | None:
    """A BSP share in (0, 1] from `text`, or None when it is not one."""
    try:
        share = float(text)
    except ValueError:
        return None
    return share if 0.0 < share <= 1.0 else None


@dataclass(frozen=True)
class BspShare:
    share: float | None  # None: `auto`, not resolved yet
    auto: bool = False
    text: str = field(default="", compare=False)

    @staticmethod
    def parse(text: str) -> BspShare:
        text = str(text).strip()
        if text == "auto":
            return BspShare(None, True, text)
        share = parse_share(text)
        if share is None:
            raise UserError(f"--switch-at: expected 'auto' or a BSP share in (0, 1], got "
                            f"{text!r}")
        return BspShare(share, False, text)

    def resolved(self, stored: float) -> BspShare:
        """`auto` with the share a search stored."""
        return BspShare(stored, self.auto, self.text)

    def __str__(self) -> str:
        return self.text or ("auto" if self.auto else f"{self.share:g}")
