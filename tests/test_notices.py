"""What trainer 0's validations tell every trainer (`shadowsync.train.notices`): events its
workers read, set in the other trainers over RPC, and the decay's record for a later attempt."""

import multiprocessing

from shadowsync.train import notices
from shadowsync.train.notices import DECAY_RECORD, JobNotices, Notices


def _events() -> Notices:
    ctx = multiprocessing.get_context("spawn")
    return Notices(stop=ctx.Event(), decay=ctx.Event())


def test_the_decay_starts_once_and_is_recorded_for_a_later_attempt(tmp_path):
    own = _events()
    job = JobNotices(own, peers=[], out=tmp_path)
    job.begin(resumed=False)
    assert not own.decay.is_set() and not (tmp_path / DECAY_RECORD).exists()
    assert job.start_decay() is True
    assert own.decay.is_set() and (tmp_path / DECAY_RECORD).exists()
    assert job.start_decay() is False  # already started: said once

    resumed = _events()  # a later attempt of the same run: the decay starts again at once
    JobNotices(resumed, peers=[], out=tmp_path).begin(resumed=True)
    assert resumed.decay.is_set()

    fresh = _events()  # a new run in the same OUT forgets the record
    JobNotices(fresh, peers=[], out=tmp_path).begin(resumed=False)
    assert not fresh.decay.is_set() and not (tmp_path / DECAY_RECORD).exists()


def test_early_stop_sets_this_trainers_event_and_the_one_another_trainer_serves(tmp_path):
    own, other = _events(), _events()
    JobNotices(own, peers=[], out=tmp_path).stop()
    assert own.stop.is_set() and not own.decay.is_set()
    notices.serve_notices(other)  # what a peer's RPC handlers reach
    try:
        notices.stop_here()
        notices.decay_here()
    finally:
        notices.serve_notices(Notices())
    assert other.stop.is_set() and other.decay.is_set()


def test_without_decay_on_plateau_nothing_is_recorded(tmp_path):
    job = JobNotices(Notices(), peers=[], out=tmp_path)
    job.begin(resumed=True)
    assert job.start_decay() is False
    job.stop()  # a mode that cannot stop early: nothing to set
    assert list(tmp_path.iterdir()) == []
