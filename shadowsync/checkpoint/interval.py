"""`--checkpoint-every`: seconds or examples (no torch here: the configuration reads it)."""

from __future__ import annotations

import re

from shadowsync.errors import UserError

_EVERY = re.compile(r"^(\d+(?:\.\d+)?)s$")


def parse_every(text: str) -> tuple[str, float]:
    """'600s' -> ('seconds', 600.0), '200000' -> ('examples', 200000), '0' -> ('off', 0):
    only the final one, 'never' -> ('never', 0): none at all."""
    text = str(text).strip()
    if text == "never":
        return "never", 0.0
    if (m := _EVERY.match(text)) is not None:
        value = float(m.group(1))
        return ("seconds", value) if value > 0 else ("off", 0.0)
    if text.isdigit():
        return ("examples", float(text)) if int(text) > 0 else ("off", 0.0)
    raise UserError(f"--checkpoint-every must be seconds like '600s', a number of examples, "
                    f"0 (only at the end) or never, got {text!r}")
