"""How a user's data files are read (:class:`DataFormat`): which CSV column holds the label, the shape of one
sample, the number of classes. The same settings for a node's own data (``dfl-node start --data``) and for a
dataset the simulator and ``partition`` share out (``--dataset path/to/data.csv``).

Plain pydantic, no numpy: reading settings and drawing ``--help`` import nothing heavy.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

DEFAULT_LABEL_COLUMN = "label"
MAX_SAMPLE_VALUES = 1 << 28  # one sample of more values than this is a typo, not a sensor window


def parse_shape(value: object) -> object:
    """``6,20``, ``(6, 20)``, ``[6, 20]`` or a list of numbers → a tuple of positive ints; other values are left to
    pydantic, which then says what is wrong. A ``DFL_SAMPLE_SHAPE`` variable, a flag and a config file's list all
    mean the same."""
    if isinstance(value, str):
        parts = [part.strip() for part in value.strip().strip("()[]").split(",") if part.strip()]
        try:
            value = [int(part) for part in parts]
        except ValueError:
            raise ValueError(f"{value!r} is not a shape: whole numbers separated by commas, e.g. 6,20") from None
    if isinstance(value, list | tuple):
        shape = tuple(value)
        if not shape or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in shape):
            raise ValueError(f"{value!r} is not a shape: one or more positive whole numbers, e.g. 6,20")
        size = 1
        for d in shape:
            size *= d
        if size > MAX_SAMPLE_VALUES:
            raise ValueError(f"a sample of shape {shape} holds {size} values, more than {MAX_SAMPLE_VALUES}")
        return shape
    return value


SampleShape = Annotated[tuple[int, ...], BeforeValidator(parse_shape)]


class DataFormat(BaseModel):
    """How the samples of a user's CSV, NPZ or safetensors files are read (docs/data.md)."""

    model_config = ConfigDict(extra="forbid")

    label_column: str = Field(DEFAULT_LABEL_COLUMN, min_length=1, max_length=200,
                              description="CSV: the label's column, by its header name, or by number (0 the first, "
                                          "-1 the last); a file without a header takes its last column unless a "
                                          "number is given")
    target_column: list[str] = Field(default_factory=list, description="regression (--task regression): a CSV "
                                     "file's column to predict, by header name or number (repeatable: one target "
                                     "each, in order); default: the label column as the one target. An NPZ file's y "
                                     "holds the targets (N, or N x T numbers)")
    window: int | None = Field(None, ge=1, le=1 << 20, description="forecasting a time series (--task regression): "
                               "a CSV file is a device's series, a row a step, a column a channel; a sample is this "
                               "many steps of every channel, its targets the --horizon steps after them of the "
                               "--target-column channels (default: the last column); validation is the series' last "
                               "--val-fraction of steps, and no window crosses into it (docs/tasks.md). An .npz or "
                               ".safetensors file holds windows already")
    horizon: int = Field(1, ge=1, le=1 << 16, description="forecasting (--window): the steps ahead a window forecasts")
    stride: int = Field(1, ge=1, le=1 << 20, description="forecasting (--window): steps from one window to the next")
    sample_shape: SampleShape | None = Field(None, description="the shape each sample is reshaped to, e.g. 6,20 (6 "
                                             "channels of 20 steps); default: a CSV row is a vector of its features, "
                                             "an NPZ or safetensors file keeps its array's sample shape")
    num_classes: int | None = Field(None, ge=2, le=100_000, description="the number of classes, the same on every "
                                    "node; default: what the data says (a shard's metadata, else the largest label "
                                    "+ 1, stated at start: a device that never saw the last class infers fewer)")
