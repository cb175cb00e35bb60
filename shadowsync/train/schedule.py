"""The learning-rate schedule of a worker's pass: warm up, hold, then decay.

A warmup-stable-decay shape (a linear warmup as in Goyal et al., "Accurate, Large Minibatch
SGD", 2017; a constant rate; a linear cool-down over the last part of a fixed budget, as in
Hägele et al., "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
2024). The decay scales the dense optimizer's rate and the embeddings' rate alike.

Why the warmup: Adagrad's first updates are about lr * sign(gradient) on every weight,
whatever the gradient's size. At initialisation the gradient is dominated by the gap between
the predicted and the mean click rate, so those full-size steps push every pre-activation of
the bottom MLP's last ReLU below zero within about ten steps; when all of them die the model
loses the dense features for good. Small early steps keep them alive.

Why the decay: at a constant rate the last updates keep moving the model by as much as the
first ones, so it ends wherever the noise of its last few thousand batches left it. Lowering
both rates over the last part of the pass averages that noise out; on the default job the
held-out NE fell by about a third of a percent (measured in the README). Dense or embedding
decay alone did not move it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from shadowsync.config import OptimConfig


@dataclass(frozen=True)
class LrSchedule:
    """Factors on the learning rates at a worker's step (0-based, counted over the whole run,
    so a resumed worker carries on where it stopped)."""

    warmup_steps: int = 0  # steps over which the dense rate rises linearly to its value
    decay_share: float = 0.0  # the last share of `total_steps` over which both rates decay
    decay_floor: float = 1.0  # what the decay ends at, as a share of the rates
    total_steps: int = 0  # this worker's pass (0: not known, no decay)
    decay_start: int | None = None  # where the decay started (on a plateau), else at the end

    @classmethod
    def of(cls, optim: OptimConfig) -> LrSchedule:
        """The schedule the options ask for; `over()` sets the pass's length."""
        return cls(optim.warmup_steps, optim.lr_decay_share, optim.lr_decay_floor)

    def over(self, total_steps: int) -> LrSchedule:
        return replace(self, total_steps=total_steps)

    def decaying_from(self, step: int) -> LrSchedule:
        """The decay starts at `step` rather than `decay_share` before the end."""
        return replace(self, decay_start=step)

    def warmup(self, step: int) -> float:
        return min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps > 0 else 1.0

    def decay(self, step: int) -> float:
        """1 until the last `decay_share` of the pass, then linearly down to `decay_floor`
        (and there past the end, where a runner's worker keeps going after its pass)."""
        span = self.decay_share * self.total_steps
        if span <= 0:
            return 1.0
        start = self.total_steps - span if self.decay_start is None else self.decay_start
        into = step - start
        if into <= 0:
            return 1.0
        return max(self.decay_floor, 1.0 - (1.0 - self.decay_floor) * into / span)

    def dense(self, step: int) -> float:
        return self.warmup(step) * self.decay(step)

    def embedding(self, step: int) -> float:
        return self.decay(step)

    def attach(self, optimizer: torch.optim.Optimizer,
               done: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
        """Drive `optimizer`'s rate by `dense` from step `done` on; call `.step()` after each
        optimizer step."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.dense(step + done))
