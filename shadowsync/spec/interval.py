"""`--checkpoint-every` (seconds or examples) and `--sync-interval` (seconds, worker steps or
auto)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from shadowsync.errors import UserError

_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")

EveryKind = Literal["seconds", "examples", "off", "never"]


@dataclass(frozen=True)
class CheckpointEvery:
    """When a job checkpoints: every `value` seconds or examples; `off`: only at the end (and
    on Ctrl-C / SIGTERM); `never`: not at all."""

    kind: EveryKind
    value: float = 0.0
    text: str = field(default="", compare=False)

    @staticmethod
    def parse(text: str) -> CheckpointEvery:
        """'600s' -> seconds 600, '200000' -> examples 200000, '0' or '0s' -> off,
        'never' -> never."""
        text = str(text).strip()
        if text == "never":
            return CheckpointEvery("never", 0.0, text)
        if (m := _SECONDS.match(text)) is not None:
            value = float(m.group(1))
            return CheckpointEvery("seconds", value, text) if value > 0 else \
                CheckpointEvery("off", 0.0, text)
        if text.isdigit():
            return CheckpointEvery("examples", float(text), text) if int(text) > 0 else \
                CheckpointEvery("off", 0.0, text)
        raise UserError(f"--checkpoint-every must be seconds like '600s', a number of "
                        f"examples, 0 (only at the end) or never, got {text!r}")

    @property
    def never(self) -> bool:
        return self.kind == "never"

    def __str__(self) -> str:
        if self.text:
            return self.text
        return {"never": "never", "off": "0", "seconds": f"{self.value:g}s"}.get(
            self.kind, f"{self.value:.0f}")


_STEPS = re.compile(r"^(\d+)\s*steps?$")


@dataclass(frozen=True)
class SyncInterval:
    """When the next background round starts: `seconds` after the last one ended (0: back to
    back), once this trainer's workers have taken `steps` steps each since the last one
    began (`20steps`), or both None: paced by the CPU budget (`auto`)."""

    seconds: float | None
    text: str = field(default="", compare=False)
    steps: int | None = None

    @staticmethod
    def parse(text: str) -> SyncInterval:
        text = str(text).strip()
        if text == "auto":
            return SyncInterval(None, text)
        if (m := _STEPS.match(text)) is not None and int(m.group(1)) > 0:
            return SyncInterval(None, text, steps=int(m.group(1)))
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if not v >= 0:
            raise UserError(f"--sync-interval must be 'auto', seconds >= 0 or worker steps "
                            f"like '20steps', got {text!r}")
        return SyncInterval(v, text)

    def __str__(self) -> str:
        if self.text:
            return self.text
        if self.steps is not None:
            return f"{self.steps}steps"
        return "auto" if self.seconds is None else f"{self.seconds:g}"
