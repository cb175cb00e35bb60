"""`--switch-detector k=1.5,m=3,window=5`: the straggler detector's settings (see
`shadowsync.runners.switch.detector`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shadowsync.errors import UserError


@dataclass(frozen=True)
class DetectorConfig:
    k: float = 1.5
    m: int = 3
    window: int = 5
    text: str = field(default="", compare=False)  # as written; "" for settings made in code

    @staticmethod
    def parse(text: str, option: str = "--switch-detector") -> DetectorConfig:
        """'k=1.5,m=3,window=5'; any key may be left out."""
        values: dict[str, float] = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("k", "m", "window"):
                raise UserError(f"{option}: '{item}' must be KEY=VALUE with KEY one of k, m, "
                                "window")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                raise UserError(f"{option}: '{item}' is not a number") from None
        cfg = DetectorConfig(values.get("k", 1.5), int(values.get("m", 3)),
                             int(values.get("window", 5)), text)
        if not cfg.k > 1 or cfg.m < 1 or cfg.window < 1:
            raise UserError(f"{option}: needs k > 1, m >= 1 and window >= 1")
        return cfg

    def __str__(self) -> str:
        return self.text or f"k={self.k:g},m={self.m},window={self.window}"
