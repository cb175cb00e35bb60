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
    _change: torch.Tensor | None = field(default=None, repr=False)  # a round's, reused
    _change_pieces: list[torch.Tensor] = field(default_factory=list, repr=False)

    def flat(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The parameters end to end: a new tensor, or written into `out`."""
        return torch.cat([p.detach().reshape(-1) for p in self.params], out=out)

    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def sync_round(self, exchange: TrainerExchange) -> None:
        """Run the rule on a snapshot and write the result back.

        `overwrite` replaces the local copy, discarding what workers learned during the round;
        `delta` adds (result - snapshot), so updates made while the round ran survive.
        The snapshot is taken straight into what the exchange sends, where it can (no copy),
        and the change goes through one buffer kept from round to round: a round passes over
        the model as few times as it can, since its CPU is its budget.
        """
        if self.rule.needs_servers:
            exchange.use_centre(self.name)
        staging = getattr(exchange, "staging", None)  # (a test's plain exchange has none)
        snapshot = self.flat(out=staging(self.numel()) if staging is not None else None)
        new = self.rule.round(snapshot, exchange)
        with torch.no_grad():  # one call for every tensor
            if self.write_back == "delta":
                torch._foreach_add_(self.params, self._delta(new, snapshot))
            else:
                torch._foreach_copy_(self.params, self._pieces(new))

    def _pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [c.view_as(p) for c, p in
                zip(flat.split([p.numel() for p in self.params]), self.params)]

    def _delta(self, new: torch.Tensor, snapshot: torch.Tensor) -> list[torch.Tensor]:
        """new - snapshot, as pieces shaped like the parameters."""
        if self._change is None:
            self._change = torch.empty_like(snapshot)
            self._change_pieces = self._pieces(self._change)
        torch.sub(new, snapshot, out=self._change)
        return self._change_pieces


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
