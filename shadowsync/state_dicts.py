"""The state of several parts kept in one flat state dict (what a checkpoint shard holds):
each part's keys under a prefix of its own; and what a part is (`Checkpointable`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # annotations only: this base module stays free of torch
    import torch

V = TypeVar("V")


@runtime_checkable
class Checkpointable(Protocol):
    """A part of a process's checkpoint shard (a trainer's dense model, its workers' slots,
    its sync runner, local embedding tables, a server's tables): its tensors by name, and
    those tensors put back."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


def nest(prefix: str, state: Mapping[str, V]) -> dict[str, V]:
    """`state`'s entries, each key under `prefix` (which ends with its separator)."""
    return {f"{prefix}{key}": value for key, value in state.items()}


def part(state: Mapping[str, V], prefix: str) -> dict[str, V]:
    """The entries of `state` under `prefix`, with the prefix taken off (`nest` undone)."""
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
