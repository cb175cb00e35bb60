"""Injected stragglers: parsing and the delay they add."""

import pytest

from shadowsync.errors import UserError
from shadowsync.train.straggler import Straggler


def test_delay_applies_to_one_trainer_inside_its_window():
    s = Straggler.parse("trainer=1,slowdown=3,start=2,duration=4", trainers=4)
    assert s == Straggler(1, 3.0, 2.0, 4.0)
    assert s.delay(1, 3.0, 0.01) == pytest.approx(0.02)  # 3x: two more step times
    assert s.delay(1, 1.9, 0.01) == 0.0 and s.delay(1, 6.0, 0.01) == 0.0
    assert s.delay(0, 3.0, 0.01) == 0.0
    assert Straggler.parse("trainer=0", 1).duration == float("inf")


@pytest.mark.parametrize("text, message", [
    ("trainer=5", r"trainer=5 is not in \[0, 2\)"),
    ("speed=3", "must be KEY=VALUE"),
    ("trainer=0,slowdown=fast", "not a number"),
    ("trainer=0,slowdown=0.5", "slowdown >= 1"),
])
def test_bad_stragglers_name_the_option(text, message):
    with pytest.raises(UserError, match=f"--straggler: .*{message}"):
        Straggler.parse(text, trainers=2)
