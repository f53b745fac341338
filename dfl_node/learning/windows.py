"""A time series as samples to forecast: ``window`` consecutive steps of every channel in, the ``horizon``
steps after them of the target channels out, a window every ``stride`` steps (Darts' and GluonTS' input length,
horizon and stride).

A file of a device's series is a CSV file, a row a time step, a column a channel (the target channels are channels
too: the series' own past is an input of its forecast). A sample is ``(channels, window)``, as a sensor window is
(:class:`~dfl_node.learning.datasets.ArrayDataset`); its targets are ``horizon × targets`` values, step by step.

The series is cut into **periods**, never shuffled: validation is its last ``fraction`` of steps, and a window is
in a period only if every step it reads or forecasts is (:func:`period_split`) — none straddles training and
validation, where it would forecast what the model trained on. As the file grows, new windows come and the
validation period moves on with the series (a rolling origin).
"""

from __future__ import annotations

import numpy as np


def window_starts(steps: int, window: int, horizon: int, stride: int) -> np.ndarray:
    """The first step of every window a series of ``steps`` steps holds (the last forecast step within it)."""
    return np.arange(0, max(steps - window - horizon + 1, 0), stride, dtype=np.int64)


def windows(series: np.ndarray, targets: list[int], window: int, horizon: int,
            stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``series`` (steps, channels) as samples ``(N, channels, window)`` (float32), targets ``(N, horizon ×
    len(targets))`` (float32, step by step) and each window's first step."""
    starts = window_starts(len(series), window, horizon, stride)
    steps = starts[:, None] + np.arange(window)[None, :]
    x = np.ascontiguousarray(series[steps].transpose(0, 2, 1), dtype=np.float32)
    ahead = starts[:, None] + window + np.arange(horizon)[None, :]
    y = np.ascontiguousarray(series[ahead][:, :, targets].reshape(len(starts), -1), dtype=np.float32)
    return x, y, starts


def period_split(starts: np.ndarray, steps: int, window: int, horizon: int,
                 fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Which windows (by first step) lie wholly in the training period and which wholly in the validation period,
    the last ``fraction`` of a series of ``steps`` steps; a window across the boundary is in neither."""
    boundary = steps - int(round(steps * fraction))
    return starts + window + horizon <= boundary, starts >= boundary
