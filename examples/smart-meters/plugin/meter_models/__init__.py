"""Models for smart-meter days, as a dfl-node plugin: a day is 24 hourly demand readings, a sample of shape
(24,) (one CSV row) or (1, 24) (one channel).

dfl-node calls the factory with the sample shape and the number of classes of the node's data, on every node
with the same seed, so every node starts from the same weights; the factory only builds the module.
"""

from __future__ import annotations

from torch import nn


def meter_cnn(sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A small 1-D CNN over a day's load curve: two convolutions of width 3 (8 and 16 channels), each followed by
    a max-pool of 2, then a linear classifier: 626 parameters for 24 readings and 2 classes."""
    if len(sample_shape) == 1:
        channels, length = 1, sample_shape[0]
        head: list[nn.Module] = [nn.Unflatten(1, (1, length))]  # (batch, 24) -> (batch, 1, 24)
    elif len(sample_shape) == 2:
        (channels, length), head = sample_shape, []
    else:
        raise ValueError(f"meter-cnn takes readings (L,) or channels of readings (C, L), not {tuple(sample_shape)}")
    if length < 4:
        raise ValueError(f"meter-cnn needs at least 4 readings a sample, got {length}")
    return nn.Sequential(
        *head,
        nn.Conv1d(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2),
        nn.Flatten(), nn.Linear(16 * (length // 4), num_classes),
    )
