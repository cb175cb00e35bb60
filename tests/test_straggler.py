"""Injected stragglers: parsing and the delay they add."""

import time

import pytest

from shadowsync.errors import UserError
from shadowsync.spec.straggler import Straggler
from shadowsync.train.straggler import pace_of


def test_delay_applies_to_one_trainer_inside_its_window():
    s = Straggler.parse("trainer=1,slowdown=3,start=2,duration=4", trainers=4)
    assert s == Straggler(1, 3.0, 2.0, 4.0)
    slow, other = pace_of(s, 1), pace_of(s, 0)
    for t in (0.0, 0.5, 1.0, 1.5):  # before the window: steps of 10 ms (one of 30 ms)
        assert slow.delay(t, 0.03 if t == 1.0 else 0.01) == 0.0
    # inside: each step is held to 3x the median step before the window, 30 ms in all
    assert slow.delay(2.0, 0.01) == pytest.approx(0.02)
    assert slow.delay(3.0, 0.004) == pytest.approx(0.026)  # its CPU freed: still 30 ms
    assert slow.delay(4.0, 0.05) == 0.0  # already slower than that
    assert slow.delay(1.9, 0.01) == 0.0 and slow.delay(6.0, 0.01) == 0.0
    assert other.delay(1.0, 0.01) == 0.0 and other.delay(3.0, 0.01) == 0.0
    assert Straggler.parse("trainer=0", 1).duration == float("inf")


def test_a_window_open_from_the_start_uses_the_first_step_and_sleeps():
    pace = pace_of(Straggler.parse("trainer=0,slowdown=2", 1), 0)
    t0 = time.perf_counter()
    assert pace.sleep_after_step(0.0, 0.02) == pytest.approx(0.02)
    assert time.perf_counter() - t0 >= 0.02


def test_a_window_in_shares_of_the_job_follows_progress_not_the_clock():
    s = Straggler.parse("trainer=1,slowdown=3,start=25%,duration=50%", trainers=2)
    assert s == Straggler(1, 3.0, 0.25, 0.5, of_job=True)
    assert s.at(since_start_s=100.0, progress=0.3) == 0.3
    assert Straggler.parse("trainer=1,start=2", 2).at(100.0, 0.3) == 100.0
    slow = pace_of(s, 1)
    assert slow.delay(s.at(0.0, 0.1), 0.01) == 0.0
    assert slow.delay(s.at(99.0, 0.24), 0.01) == 0.0  # late on the clock, early in the job
    assert slow.delay(s.at(0.5, 0.25), 0.01) == pytest.approx(0.02)
    assert slow.delay(s.at(0.6, 0.749), 0.01) == pytest.approx(0.02)
    assert slow.delay(s.at(0.7, 0.75), 0.01) == 0.0


@pytest.mark.parametrize("text, message", [
    ("trainer=0,start=25%,duration=3", "both be seconds or both shares"),
    ("trainer=5", r"trainer=5 is not in \[0, 2\)"),
    ("speed=3", "must be KEY=VALUE"),
    ("trainer=0,slowdown=fast", "not a number"),
    ("trainer=0,slowdown=0.5", "slowdown >= 1"),
])
def test_bad_stragglers_name_the_option(text, message):
    with pytest.raises(UserError, match=f"--straggler: .*{message}"):
        Straggler.parse(text, trainers=2)


def test_episodes_cut_the_window_into_equal_slices_on_and_off():
    from shadowsync.spec.delay import in_episode

    # window [0.25, 0.75) in 4 episodes: 7 slices of 1/14, on in slices 0, 2, 4, 6
    on = [at for at in [0.25 + (i + 0.5) / 14 for i in range(7)] if in_episode(at, 0.25, 0.5, 4)]
    assert on == pytest.approx([0.25 + (i + 0.5) / 14 for i in (0, 2, 4, 6)])
    assert not in_episode(0.2, 0.25, 0.5, 4) and not in_episode(0.75, 0.25, 0.5, 4)
    assert in_episode(0.5, 0.25, 0.5, 1) and in_episode(5.0, 0.0, float("inf"), 3)


def test_delay_and_jitter_stragglers_parse_into_a_link_delay():
    s = Straggler.parse("kind=delay,ms=30,trainers=2,start=25%,duration=50%,episodes=4", 4)
    assert (s.kind, s.trainers, s.episodes) == ("delay", (2, 3), 4)
    assert pace_of(s, 3) is None  # nothing slows the compute
    link = s.link()
    assert link.seconds(3, 0.3) == pytest.approx(0.03) and link.seconds(1, 0.3) == 0.0
    assert link.seconds(3, 0.3 + 1 / 14) == 0.0  # a break between episodes
    jitter = Straggler.parse("kind=jitter,ms=10,jitter=4", 3).link()
    assert jitter.trainers == (0, 1, 2)
    rng = __import__("random").Random(0)
    draws = [jitter.seconds(1, 0.5, rng) for _ in range(200)]
    assert 0.006 <= min(draws) < 0.007 and 0.013 < max(draws) <= 0.014
    assert Straggler.parse("trainer=1,slowdown=3", 2).link() is None  # compute: no link


@pytest.mark.parametrize("text, message", [
    ("kind=delay,trainers=1", "needs ms > 0"),
    ("kind=netem,ms=3", "kind=netem is not one of"),
    ("kind=delay,ms=30,trainers=3", "trainers=3 needs at least 3 trainers"),
    ("kind=delay,ms=30,episodes=0", "episodes >= 1"),
])
def test_bad_network_stragglers_name_the_option(text, message):
    with pytest.raises(UserError, match=f"--straggler: .*{message}"):
        Straggler.parse(text, trainers=2)


@pytest.mark.parametrize("name", ["compute", "delay", "jitter"])
def test_each_kind_slows_what_its_registry_entry_says(name):
    """`spec.straggler_kinds.KINDS`: a kind that delays pushes gets a link and no step pace,
    the compute kind a pace and no link; one that slows every trainer ignores trainers=."""
    from shadowsync.spec.straggler_kinds import KINDS

    entry = KINDS[name]
    s = Straggler.parse(f"kind={name},ms=5,trainers=1", 3)
    assert s.slows is entry
    assert (s.link() is not None) == entry.delays_pushes
    assert (pace_of(s, s.trainer) is None) == entry.delays_pushes
    assert s.trainers == ((0, 1, 2) if entry.every_trainer else (2,))
