"""unique_with_inverse: torch.unique(return_inverse=True)'s answer, from one numpy sort."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowsync.embeddings.unique import unique_with_inverse


def same_as_torch(keys: torch.Tensor) -> None:
    got, inverse = unique_with_inverse(keys)
    want, want_inverse = torch.unique(keys, return_inverse=True)
    assert got.dtype == torch.int64 and inverse.dtype == torch.int64
    assert torch.equal(got, want) and torch.equal(inverse, want_inverse)
    assert torch.equal(got[inverse], keys)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=300))
def test_small_key_ranges_with_many_repeats(values):
    same_as_torch(torch.tensor(values, dtype=torch.int64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=50))
def test_keys_too_large_or_negative_to_pack_give_the_same_answer(values):
    same_as_torch(torch.tensor(values, dtype=torch.int64))


def test_a_batch_of_a_large_table():
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2_600_000, (6656,), generator=g)
    keys[::3] = keys[1::3][: len(keys[::3])]  # repeats, as a skewed batch has
    same_as_torch(keys)
    same_as_torch(keys[::2])  # a strided view


def test_keys_within_a_narrow_span_are_counted_in_place_with_the_same_answer():
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 76_000, (6656,), generator=g)  # a dynamic pool's rows, from 0 up
    rows[::4] = 0  # the default row, read by ids not admitted
    same_as_torch(rows)
    same_as_torch(rows - 10**15)  # shifted, and negative
    same_as_torch(torch.tensor([2**62, 2**62 + 3, 2**62]))
