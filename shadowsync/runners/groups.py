"""Parameter groups: a slice of the dense model, the rule that syncs it, and how the result
is written back while Hogwild workers keep updating the same memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shadowsync.rules import SyncRule
from shadowsync.transport.collectives import TrainerExchange

WRITE_BACK = ("delta", "overwrite")


@dataclass
class ParamGroup:
    name: str
    params: list[torch.Tensor]  # the trainer's shared-memory tensors
    rule: SyncRule
    write_back: str = "delta"
    _snapshot: torch.Tensor | None = field(default=None, repr=False)

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def sync_round(self, exchange: TrainerExchange) -> None:
        """Run the rule on a snapshot and write the result back.

        `overwrite` replaces the local copy, discarding what workers learned during the round;
        `delta` adds (result - snapshot), so updates made while the round ran survive.
        """
        if self.rule.needs_servers:
            exchange.use_centre(self.name)
        snapshot = self.flat()
        new = self.rule.round(snapshot, exchange)
        change = new - snapshot if self.write_back == "delta" else new
        pieces = [c.view_as(p) for c, p in
                  zip(change.split([p.numel() for p in self.params]), self.params)]
        with torch.no_grad():  # one call for every tensor: the round's CPU is its budget
            if self.write_back == "delta":
                torch._foreach_add_(self.params, pieces)
            else:
                torch._foreach_copy_(self.params, pieces)


def split_model(model: torch.nn.Module,
                assignment: dict[str, str]) -> dict[str, list[torch.Tensor]]:
    """Parameters by group. `assignment` maps a module prefix (e.g. 'bottom', 'top') to a group
    name; parameters under no prefix go to the group '*'."""
    groups: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        key = next((g for prefix, g in assignment.items()
                    if name == prefix or name.startswith(prefix + ".")), "*")
        groups.setdefault(key, []).append(p)
    return groups
