"""The state of several parts kept in one flat state dict (what a checkpoint shard holds):
each part's keys under a prefix of its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")


def nest(prefix: str, state: Mapping[str, V]) -> dict[str, V]:
    """`state`'s entries, each key under `prefix` (which ends with its separator)."""
    return {f"{prefix}{key}": value for key, value in state.items()}


def part(state: Mapping[str, V], prefix: str) -> dict[str, V]:
    """The entries of `state` under `prefix`, with the prefix taken off (`nest` undone)."""
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
