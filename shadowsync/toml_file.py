"""Reading a TOML file a user wrote, with one-line errors that name it."""

from __future__ import annotations

import sys

from shadowsync.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def read_toml(path: str, label: str) -> dict[str, object]:
    """The table in `path`; a missing or malformed file is a UserError starting with `label`."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"{label}: no such file or directory") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{label}: invalid TOML: {e}") from None
