"""Warm-up of a rule's steady-state settings over its first rounds (BMUF's block momentum;
EASGD's first rounds are model averaging instead, `rules.easgd`).

BMUF's block momentum eta and EASGD's elastic pull alpha are tuned for a run of many rounds,
where one round's update looks like the last. The first rounds are not like that: the replicas
move further between two of them than in the rest of the run (a block's update can be as
large as the model itself), and the size of that move changes from round to round. Block
momentum then extrapolates a large old block into a round whose own update is a third of it;
an elastic pull drags the replicas back towards a centre that still sits near the initial
model. A job with a handful of rounds is all transient, and ends where that overshoot or drag
left it.

So the r-th round (counting from 1) uses a share of the setting,

    s_r = s * min(1, r / R)         (R = warmup_rounds; R = 0: s from the first round)

which makes a short job's rounds close to model averaging and leaves a long job, after its
first R rounds, with the paper's rule unchanged.
"""

from __future__ import annotations


def ramp(round_index: int, warmup_rounds: int) -> float:
    """The share min(1, r / R) of a setting in round r = `round_index` (from 1)."""
    if warmup_rounds <= 0:
        return 1.0
    return min(1.0, max(0, round_index) / warmup_rounds)
