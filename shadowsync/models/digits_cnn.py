"""A small CNN for 8x8 digit images (scikit-learn's `load_digits`), the image-classification
model of the `digits` task. Two 3x3 convolutions, one 2x2 pooling, two linear layers: about
40k parameters, a few milliseconds a batch on one core.

It takes the same two inputs as `DLRMDense` (dense features, embedded vectors) so the spine
treats both alike; digits have no categorical features, so `embedded` is empty and unused.
"""

from __future__ import annotations

import torch
from torch import nn

SIDE = 8
CLASSES = 10


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * (SIDE // 2) ** 2, hidden), nn.ReLU(),
            nn.Linear(hidden, CLASSES),
        )

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor | None = None) -> torch.Tensor:
        """dense [B, 64] pixel intensities in [0, 1] -> logits [B, 10]."""
        return self.head(self.features(dense.view(-1, 1, SIDE, SIDE)))
