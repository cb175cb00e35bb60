"""What every option value type of this layer offers the configuration."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class OptionValue(Protocol):
    """A parsed option. `text` is what the user wrote ("" for a value made in code);
    `str(value)` is that text, or the value written out, so that writing a configuration to
    TOML and reading it back gives the same value."""

    @property
    def text(self) -> str: ...
