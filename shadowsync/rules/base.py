"""The two interfaces every rule is written against."""

from __future__ import annotations

from typing import Protocol

import torch


class Exchange(Protocol):
    """How a rule reaches the rest of the job. Collectives and servers implement it; tests use
    plain tensors."""

    def mean(self, local: torch.Tensor) -> torch.Tensor:
        """The average of `local` over all trainers (an AllReduce)."""
        ...

    def every_trainer_done(self) -> bool:
        """Whether every trainer had finished training when this round began, which makes it
        the job's last (agreed by all trainers; after `mean` it costs nothing more)."""
        ...

    def centre(self) -> torch.Tensor:
        """The current centre variable held on the dense parameter servers."""
        ...

    def add_to_centre(self, delta: torch.Tensor) -> None:
        """Add `delta` to the centre variable on the servers."""
        ...


class SyncRule(Protocol):
    name: str
    needs_servers: bool  # True if the rule talks to dense parameter servers, not to peers

    def start(self, initial: torch.Tensor) -> None:
        """Called once with the (identical) starting parameters of every trainer."""
        ...

    def round(self, local: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        """One synchronization round: the new value for the local parameters."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The rule's own state for a checkpoint (BMUF's global model and block momentum;
        empty for a rule that keeps none), after `start`."""
        ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` gave, after `start`."""
        ...

    def settings(self) -> dict[str, object]:
        ...
