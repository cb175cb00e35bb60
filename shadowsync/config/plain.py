"""Option values as TOML and JSON hold them: a typed value (`shadowsync.spec`) as its text, a
model factory as the MODULE:FUNCTION that finds it again."""

from __future__ import annotations

from collections.abc import Callable

from shadowsync.spec.value import OptionValue


def model_name(model: str | Callable[..., object]) -> str:
    """How a model option is written in messages, summary.json and config.toml: a factory
    as the MODULE:FUNCTION that finds it again."""
    return f"{model.__module__}:{model.__qualname__}" if callable(model) else model


def plain(value: object) -> object:
    """An option's value as TOML and JSON hold it: a typed value (`shadowsync.spec`) as its
    text."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    return str(value) if isinstance(value, OptionValue) else value


def toml_value(value: object) -> str:
    """One value as a TOML line writes it."""
    value = plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
    return repr(value)
