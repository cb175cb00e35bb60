"""Configuration at a switch: the learning rate and momentum each step of a phase uses.

Sync-Switch's configuration policy (Li et al., ICDCS 2021, arXiv 2104.08364): BSP with n
workers of batch b at learning rate L is one step of the global batch n x b; ASP applies each
worker's batch b on its own, so it runs at L / n (linear scaling). The original saw NaN losses
after a switch without this scaling. Momentum across a switch is kept, zeroed, or zeroed and
ramped back linearly over `RAMP_STEPS` steps; the paper found that momentum tricks did not
help, so `keep` is the default.

Momentum compensation (off by default, `--switch-compensate-momentum` to turn it on): n
asynchronous workers already act like momentum 1 - 1/n (Mitliagkas, Zhang, Hadjis, Re,
"Asynchrony begets momentum", 2016), so ASP steps run at explicit momentum
max(0, m - (1 - 1/n)) and the total stays near m. The configuration ablation of `bench
switch --full` (digits, 4 trainers, lr 0.1, m 0.9, BSP 50% then ASP; 3 seeds, paired with
BSP): the paper's policy 0.0 accuracy points on every seed; compensation, momentum zeroed
and ramped each 0.0 as a median, compensation down to -0.33; without the scaling one seed of
three fell to chance (-88 points), as the original's NaN losses; ASP first, then BSP, -4.3
(-90 to -0.67). No variant beat the paper's policy, so it is the default; compensation
stays an option.
"""

from __future__ import annotations

from dataclasses import dataclass

from shadowsync.protocols import Protocol

MOMENTUM_POLICIES = ("keep", "zero", "ramp")
RAMP_STEPS = 50


@dataclass(frozen=True)
class StepSettings:
    lr: float
    momentum: float
    reset_momentum: bool


def asp_momentum(momentum: float, workers: int) -> float:
    """Explicit momentum under ASP that, with the implicit 1 - 1/n of asynchrony, makes m."""
    return max(0.0, momentum - (1.0 - 1.0 / workers))


def step_settings(mode: Protocol, lr: float, workers: int, momentum: float, policy: str,
                  step_in_phase: int, after_switch: bool, scale_lr: bool = True,
                  compensate: bool = False) -> StepSettings:
    """Settings of one step, `step_in_phase` steps into a phase (0 = its first step).

    `lr` is the BSP learning rate L; `workers` the n workers pushing gradients; `after_switch`
    is False in a run's first phase (there is nothing to switch from); `scale_lr` False keeps
    L for ASP too; `compensate` lowers ASP's momentum by asynchrony's implicit share.
    """
    step_lr = lr / workers if (mode == Protocol.ASP and scale_lr) else lr
    if mode == Protocol.ASP and compensate:
        momentum = asp_momentum(momentum, workers)
    if not after_switch or policy == "keep":
        return StepSettings(step_lr, momentum, False)
    reset = step_in_phase == 0
    if policy == "zero":
        return StepSettings(step_lr, momentum, reset)
    ramped = momentum * min(1.0, step_in_phase / RAMP_STEPS)
    return StepSettings(step_lr, ramped, reset)
