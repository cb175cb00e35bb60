"""The update a parameter server applies to the parameters it holds, one gradient at a time.

The protocols (`bsp`, `asp`) decide which gradient to apply and when; this module decides what
applying it means. Both optimizers are elementwise, so a tensor sharded over several servers
is updated exactly as it would be whole.

- `sgd`: heavy-ball momentum, v = m * v + g; w = w - lr * v (the momentum SGD of Sync-Switch's
  experiments, Li et al., ICDCS 2021, arXiv 2104.08364).
- `adagrad`: s = s + g * g; w = w - lr * g / (sqrt(s) + eps) (torch.optim.Adagrad's form).

`version` counts applied updates; ASP's staleness is measured against it.

A gradient may bring its own momentum buffer (`slot=`): an isolated straggler's asynchronous
pushes (`isolate`) run their heavy ball apart from the BSP steps', so late gradients at ASP's
rate do not ride in the buffer of the synchronous ones and the other way round. Adagrad's sum
of squares is per-coordinate step-size memory, not momentum: it stays shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ADAGRAD_EPS = 1e-10


@dataclass
class ServerState:
    params: torch.Tensor
    slot: torch.Tensor = field(default=None)  # type: ignore[assignment]  # momentum / sum g^2
    version: int = 0

    def __post_init__(self) -> None:
        if self.slot is None:
            self.slot = torch.zeros_like(self.params)


def apply_update(state: ServerState, grad: torch.Tensor, optimizer: str, lr: float,
                 momentum: float = 0.0, slot: torch.Tensor | None = None) -> None:
    """One optimizer step with `grad`; bumps the version. `slot`: a momentum buffer of its
    own for this gradient (SGD), else the state's."""
    if optimizer == "sgd":
        velocity = state.slot if slot is None else slot
        velocity.mul_(momentum).add_(grad)
        state.params.add_(velocity, alpha=-lr)
    elif optimizer == "adagrad":
        state.slot.addcmul_(grad, grad)
        state.params.addcdiv_(grad, state.slot.sqrt().add_(ADAGRAD_EPS), value=-lr)
    else:
        raise ValueError(f"unknown server optimizer {optimizer!r}")
    state.version += 1


def reset_momentum(state: ServerState, optimizer: str) -> None:
    """Forget the momentum (SGD). Adagrad's sum of squares is step-size memory, not momentum,
    and is kept."""
    if optimizer == "sgd":
        state.slot.zero_()
