"""Each synchronization rule against its closed form, on plain tensors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowsync.rules import make_rule
from tests.helpers import LockStep


class Replicas:
    """An in-memory Exchange: T replicas taking turns in one lock-step round."""

    def __init__(self, values: list[torch.Tensor], centre: torch.Tensor | None = None,
                 last: bool = False):
        self.values = values
        self._centre = centre
        self.last = last  # every trainer has finished training: the job's last round

    def mean(self, local):
        return torch.stack(self.values).mean(0)

    def every_trainer_done(self):
        return self.last

    def centre(self):
        return self._centre.clone()

    def add_to_centre(self, delta):
        self._centre += delta


def test_ma_replaces_every_replica_by_the_mean():
    w = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])]
    ex = Replicas(w)
    rule = make_rule("ma")
    rule.start(w[0])
    assert torch.equal(rule.round(w[0], ex), torch.tensor([2.0, 4.0]))


def test_bmuf_two_rounds_match_hand_computation():
    eta, zeta = 0.5, 0.8
    rule = make_rule("bmuf", trainers=2, block_momentum=eta, block_lr=zeta)
    w0 = torch.tensor([1.0, -1.0])
    rule.start(w0)
    # round 1: mean 2.0, -3.0 -> G = (1, -2), delta = 0.8 * G, w_g = w0 + delta
    ex = Replicas([torch.tensor([1.0, -2.0]), torch.tensor([3.0, -4.0])])
    out1 = rule.round(ex.values[0], ex)
    assert torch.allclose(out1, torch.tensor([1.8, -2.6]))
    # round 2: mean (2.8, -2.6) -> G = (1, 0); delta = 0.5*(0.8,-1.6) + 0.8*(1,0) = (1.2, -0.8)
    ex = Replicas([torch.tensor([2.8, -2.0]), torch.tensor([2.8, -3.2])])
    out2 = rule.round(ex.values[0], ex)
    assert torch.allclose(out2, torch.tensor([3.0, -3.4]))


def test_bmuf_nesterov_looks_ahead_by_eta_delta():
    rule = make_rule("bmuf", trainers=4, nesterov=True)
    assert rule.eta == 0.75 and rule.zeta == 1.0
    rule.start(torch.zeros(3))
    ex = Replicas([torch.ones(3), torch.ones(3) * 3])
    out = rule.round(ex.values[0], ex)  # G = 2, delta = 2, w_g = 2, local = 2 + 0.75 * 2
    assert torch.allclose(out, torch.full((3,), 3.5))


def test_bmuf_nesterov_measures_the_block_from_where_it_started():
    """Trainers that learn nothing in a block hand back the look-ahead point they were given:
    the block update is zero, so the momentum only decays (delta -> eta * delta) and w_g
    moves by it. Measuring from w_g instead counted the look-ahead again each round: at
    eta = 0.5 the momentum never decayed and w_g drifted on without any training."""
    eta = 0.5
    rule = make_rule("bmuf", trainers=2, nesterov=True)
    rule.start(torch.zeros(2))
    out = rule.round(None, Replicas([torch.full((2,), 1.0), torch.full((2,), 3.0)]))
    # G = 2, delta = 2, w_g = 2, handed out 2 + 0.5 * 2 = 3
    assert torch.allclose(out, torch.full((2,), 3.0))
    w_g, delta = 2.0, 2.0
    for _ in range(5):
        out = rule.round(None, Replicas([out.clone(), out.clone()]))
        delta *= eta
        w_g += delta
        assert torch.allclose(out, torch.full((2,), w_g + eta * delta))
    assert w_g < 2.0 + 2.0 * eta / (1 - eta)  # bounded: the momentum's geometric sum


@pytest.mark.parametrize("nesterov", [False, True])
def test_bmuf_ends_the_job_at_the_replicas_average_not_a_momentum_step_past_it(nesterov):
    """Round 1 leaves delta = 2 (w_g = 2); in the last round the replicas average 3, where
    the filtered step would end at 2 + 0.5 * 2 + 1 = 4. With the look-ahead the block
    started at 2 + 0.5 * 2 = 3, so G = 0 and it would end at 3 + 0.5 * 1 = 3.5."""
    rule = make_rule("bmuf", trainers=2, block_momentum=0.5, nesterov=nesterov)
    rule.start(torch.zeros(2))
    rule.round(None, Replicas([torch.full((2,), 1.0), torch.full((2,), 3.0)]))
    assert torch.allclose(rule.global_model, torch.full((2,), 2.0))
    end = rule.round(None, Replicas([torch.full((2,), 2.0), torch.full((2,), 4.0)], last=True))
    assert torch.allclose(end, torch.full((2,), 3.0))
    assert torch.allclose(rule.state_dict()["global_model"], torch.full((2,), 3.0))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=6))
def test_bmuf_without_momentum_is_model_averaging(vals):
    w = [torch.tensor([v, -v]) for v in vals]
    bmuf = make_rule("bmuf", trainers=len(w), block_momentum=0.0, block_lr=1.0)
    bmuf.start(torch.zeros(2))
    ma = make_rule("ma")
    assert torch.allclose(bmuf.round(w[0], Replicas(w)), ma.round(w[0], Replicas(w)), atol=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.01, 1.0), st.lists(st.floats(-50, 50), min_size=3, max_size=3),
       st.lists(st.floats(-50, 50), min_size=3, max_size=3))
def test_easgd_elastic_step_and_conservation(alpha, local, centre):
    w = torch.tensor(local, dtype=torch.float64)
    c = torch.tensor(centre, dtype=torch.float64)
    ex = Replicas([w], centre=c.clone())
    new = make_rule("easgd", alpha=alpha).round(w, ex)
    d = alpha * (w - c)
    assert torch.allclose(new, w - d)
    assert torch.allclose(ex._centre, c + d)
    assert torch.allclose(new + ex._centre, w + c)  # w_i + centre is conserved


def test_easgd_half_rate_meets_at_midpoint():
    ex = Replicas([], centre=torch.tensor([0.0]))
    new = make_rule("easgd", alpha=0.5).round(torch.tensor([4.0]), ex)
    assert new.item() == 2.0 and ex._centre.item() == 2.0


def test_warmup_ramps_a_setting_linearly_over_its_rounds():
    from shadowsync.rules.warmup import ramp

    assert [ramp(r, 4) for r in (1, 2, 3, 4, 5, 40)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert ramp(1, 0) == 1.0


def test_bmuf_block_momentum_warms_up_over_its_first_rounds():
    """eta = 1/2, R = 4: rounds 1-3 filter with eta/4, eta/2, 3 eta/4. Round 1: G = 2, so
    delta = 2, w_g = 2; round 2: G = 1, delta = 0.25 * 2 + 1 = 1.5, w_g = 3.5; round 3:
    G = 0.5, delta = 0.375 * 1.5 + 0.5 = 1.0625, w_g = 4.5625."""
    rule = make_rule("bmuf", trainers=2, warmup_rounds=4)
    rule.start(torch.zeros(1))
    for mean, w_g in ((2.0, 2.0), (3.0, 3.5), (4.0, 4.5625)):
        out = rule.round(None, Replicas([torch.full((1,), mean)]))
        assert torch.allclose(out, torch.full((1,), w_g))
    assert rule.block_momentum == 0.5  # round 4 on: the paper's eta


def test_bmuf_rounds_survive_a_checkpoint_and_an_older_one_resumes_warmed_up():
    rule = make_rule("bmuf", trainers=2, warmup_rounds=10)
    rule.start(torch.zeros(2))
    for _ in range(3):
        rule.round(None, Replicas([torch.ones(2)]))
    state = {k: v.clone() for k, v in rule.state_dict().items()}
    again = make_rule("bmuf", trainers=2, warmup_rounds=10)
    again.load_state_dict(state)
    assert again.rounds == 3 and again.block_momentum == 0.5 * 4 / 10
    del state["rounds"]
    again.load_state_dict(state)
    assert again.block_momentum == 0.5


def test_easgd_warmup_rounds_are_model_averaging_with_the_centre_at_the_average():
    """2 trainers, alpha = 1/2, R = 2, centre 0. Round 1: replicas 1 and 5 both become 3,
    the centre 3; round 2 (after training moved them to 4 and 6): 5 and 5; round 3 (6 and 8)
    pulls: d = (6 - 5) / 2 and (8 - 5) / 2, replicas 5.5 and 6.5, the centre 5 + 2 = 7."""
    rules = [make_rule("easgd", alpha=0.5, warmup_rounds=2, trainers=2) for _ in range(2)]
    ex = LockStep(torch.tensor([0.0]))
    for values, agreed in (([1.0, 5.0], 3.0), ([4.0, 6.0], 5.0)):
        out = ex.round(rules, [torch.tensor([v]) for v in values])
        assert [o.item() for o in out] == [agreed, agreed] and ex.centre_value.item() == agreed
    out = ex.round(rules, [torch.tensor([6.0]), torch.tensor([8.0])])
    assert [o.item() for o in out] == [5.5, 6.5] and ex.centre_value.item() == 7.0


def test_easgd_centre_stays_the_replicas_average_through_the_warmup_with_more_trainers():
    rules = [make_rule("easgd", alpha=0.5, warmup_rounds=5, trainers=3) for _ in range(3)]
    ex = LockStep(torch.zeros(4))
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        values = [torch.randn(4, generator=gen) for _ in range(3)]
        out = ex.round(rules, values)
        mean = torch.stack(values).mean(0)
        assert all(torch.allclose(o, mean) for o in out)
        assert torch.allclose(ex.centre_value, mean, atol=1e-6)


def test_easgd_ends_the_job_at_the_replicas_average_and_leaves_the_centre():
    rule = make_rule("easgd", alpha=0.5)
    ex = Replicas([torch.tensor([1.0]), torch.tensor([5.0])], centre=torch.tensor([0.0]),
                  last=True)
    assert rule.round(ex.values[0], ex).item() == 3.0 and ex._centre.item() == 0.0
