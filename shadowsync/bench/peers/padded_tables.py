"""fbgemm's row width: the TorchRec peer's tables padded to it, set to train as ours (without
TorchRec: the peer's module imports it, this one does not)."""

from __future__ import annotations

FBGEMM_WIDTH_MULTIPLE = 4


def fbgemm_tables(width: int, lr: float, initial_accumulator: float) -> tuple[int, float, float]:
    """The padded width of tables `width` columns wide, and the row-wise Adagrad rate and
    starting accumulator that make the padded rows train as ours.

    Row-wise Adagrad adds the mean of a row's squared gradient over its columns to the row's
    accumulator; the padding columns get no gradient, so the padded row's accumulator takes
    k = width / padded times each increment ours takes. Started at k times ours and stepped at
    sqrt(k) times our rate, its steps are ours exactly (up to eps), and the padding stays
    zero."""
    padded = -(-width // FBGEMM_WIDTH_MULTIPLE) * FBGEMM_WIDTH_MULTIPLE
    k = width / padded
    return padded, lr * k**0.5, initial_accumulator * k
