"""Configuration at a switch: the learning rate and momentum each step of a phase uses.

Sync-Switch's configuration policy (Li et al., ICDCS 2021, arXiv 2104.08364): BSP with n
workers of batch b at learning rate L is one step of the global batch n x b; ASP applies each
worker's batch b on its own, so it runs at L / n (linear scaling). The original saw NaN losses
after a switch without this scaling. Momentum across a switch is kept, zeroed, or zeroed and
ramped back linearly over `RAMP_STEPS` steps; the paper found that momentum tricks did not
help, so `keep` is the default.
"""

from __future__ import annotations

from dataclasses import dataclass

MOMENTUM_POLICIES = ("keep", "zero", "ramp")
RAMP_STEPS = 50


@dataclass(frozen=True)
class StepSettings:
    lr: float
    momentum: float
    reset_momentum: bool


def step_settings(mode: str, lr: float, workers: int, momentum: float, policy: str,
                  step_in_phase: int, after_switch: bool, scale_lr: bool = True) -> StepSettings:
    """Settings of one step, `step_in_phase` steps into a phase (0 = its first step).

    `lr` is the BSP learning rate L; `workers` the n workers pushing gradients; `after_switch`
    is False in a run's first phase (there is nothing to switch from); `scale_lr` False keeps
    L for ASP too (a plain `--sync asp` run, whose --lr is already per worker).
    """
    step_lr = lr / workers if (mode == "asp" and scale_lr) else lr
    if not after_switch or policy == "keep":
        return StepSettings(step_lr, momentum, False)
    reset = step_in_phase == 0
    if policy == "zero":
        return StepSettings(step_lr, momentum, reset)
    ramped = momentum * min(1.0, step_in_phase / RAMP_STEPS)
    return StepSettings(step_lr, ramped, reset)
