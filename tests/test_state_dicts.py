"""Parts of one flat state dict: `part` undoes `nest` and takes nothing of another part."""

from hypothesis import given
from hypothesis import strategies as st

from shadowsync.state_dicts import nest, part

states = st.dictionaries(st.text(max_size=8), st.integers(), max_size=6)


@given(states, states)
def test_part_gives_back_each_nested_state_alone(a, b):
    flat = {**nest("a/", a), **nest("b/", b)}
    assert part(flat, "a/") == a and part(flat, "b/") == b
    assert len(flat) == len(a) + len(b)
    assert part(flat, "c/") == {}
