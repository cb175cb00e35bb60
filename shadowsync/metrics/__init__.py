"""Quality and speed metrics for CTR models."""

from shadowsync.metrics.ctr import (
    RunningNE,
    binary_entropy,
    calibration,
    evaluate_predictions,
    log_loss,
    normalized_entropy,
    worse_than_constant,
)

__all__ = [
    "RunningNE",
    "binary_entropy",
    "calibration",
    "evaluate_predictions",
    "log_loss",
    "normalized_entropy",
    "worse_than_constant",
]
