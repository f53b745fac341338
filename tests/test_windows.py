"""A device's time series as forecasting windows: input length, horizon and stride; validation is the
series' last period and no window crosses into it; the windows grow with the file; a fleet forecasts from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dfl_node.errors import InputError
from dfl_node.learning.data_files import read_samples
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.local_data import LocalData
from dfl_node.learning.windows import period_split, windows
from dfl_node.settings.experiment import ExperimentConfig
from tests.helpers.fleet import simulated

SERIES = DataFormat(window=4, horizon=2, stride=1, target_column=["load"])


def write_series(path: Path, steps: int, start: int = 0) -> None:
    """Two channels: ``load`` counts the steps (its value is its step), ``temp`` is ten times it."""
    t = np.arange(start, start + steps)
    rows = "".join(f"{a},{b}\n" for a, b in zip(t, 10 * t, strict=True))
    if start == 0:
        path.write_text("load,temp\n" + rows)
    else:
        with path.open("a") as f:
            f.write(rows)


def test_a_window_reads_every_channel_and_forecasts_the_targets_steps_after_it() -> None:
    series = np.c_[np.arange(10), 10 * np.arange(10)].astype(np.float32)
    x, y, starts = windows(series, [0], window=4, horizon=2, stride=3)
    assert starts.tolist() == [0, 3]  # a window needs 4 + 2 steps: starts 0 and 3 fit in 10, 6 does not
    assert x.shape == (2, 2, 4) and x[1].tolist() == [[3, 4, 5, 6], [30, 40, 50, 60]]  # (channels, window)
    assert y.tolist() == [[4, 5], [7, 8]]  # the 2 steps of load after each window


def test_validation_is_the_last_period_and_no_window_crosses_into_it(tmp_path: Path) -> None:
    path = tmp_path / "meter.csv"
    write_series(path, 100)
    data = LocalData(path, SERIES, val_fraction=0.2, max_samples=0, seed=0, reads="targets")
    view = data.load()
    assert data.num_classes == 2 and view.train.input_shape == (2, 4)
    train_ends = view.train.y[:, -1].numpy()  # the last step a training window forecasts (load = its step)
    val_starts = view.val.x[:, 0, 0].numpy()  # the first step a validation window reads
    assert train_ends.max() < 80 <= val_starts.min()  # steps 80..99 are the validation period
    assert len(view.train) == 75 and len(view.val) == 15  # windows across step 80 (75..79 start) are in neither
    assert (view.train.x[:, 0, 1:] - view.train.x[:, 0, :-1] == 1).all()  # consecutive steps, never shuffled

    write_series(path, 50, start=100)  # the file grows: new windows, and the validation period moves on with it
    grown, problems = data.refresh(data.scan())
    assert grown is not None and not problems
    assert grown.train.y[:, -1].max() < 120 <= grown.val.x[:, 0, 0].min() and len(grown.val) == 25


def test_period_split_leaves_out_the_windows_across_the_boundary() -> None:
    train, val = period_split(np.arange(0, 95), steps=100, window=4, horizon=2, fraction=0.2)
    assert np.flatnonzero(train).max() == 74 and np.flatnonzero(val).min() == 80
    assert not (train & val).any() and (~(train | val)).sum() == 5


def test_windows_need_a_forecast_and_a_csv_series(tmp_path: Path) -> None:
    path = tmp_path / "meter.csv"
    write_series(path, 20)
    with pytest.raises(InputError, match="--window makes forecasting samples of a series: it needs --task regression"):
        read_samples(path, SERIES)
    with pytest.raises(InputError, match="no column 'demand' in its header"):
        read_samples(path, SERIES.model_copy(update={"target_column": ["demand"]}), targets=True)


def test_a_fleet_forecasts_its_devices_series(tmp_path: Path) -> None:
    """Three devices, each a series of its own (a daily cycle at its own phase, and noise), forecast the next two
    steps from the last eight, as they were recorded: the fleet's RMSE ends well below the series' spread."""
    rng = np.random.default_rng(0)
    for device in range(3):
        t = np.arange(400)
        load = np.sin(2 * np.pi * (t / 24 + device / 3)) + 0.05 * rng.standard_normal(len(t))
        folder = tmp_path / "fleet" / f"device-{device}"
        folder.mkdir(parents=True)
        np.savetxt(folder / "series.csv", np.c_[load, np.cos(2 * np.pi * t / 24)], delimiter=",",
                   header="load,hour", comments="", fmt="%.5f")
    config = ExperimentConfig.model_validate({
        "dataset": str(tmp_path / "fleet"), "partition": "as-recorded", "task": "regression", "window": 8,
        "horizon": 2, "target_column": ["load"], "rounds": 60, "eval_every": 60, "hidden": [16], "lr": 0.02})
    result, _ = simulated(config, "defkt", tmp_path / "sim")
    assert [n.num_train for n in result.nodes] == [311] * 3  # (400 - 80) steps' windows: 320 - 8 - 2 + 1
    assert result.metric == "rmse" and max(n.local_accuracy for n in result.nodes) < 0.2  # the series' std: 0.7
