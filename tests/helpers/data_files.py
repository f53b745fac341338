"""A user's data as files: samples to write (:func:`blobs`) and the CSV file a user gives (:func:`write_csv`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, header: bool = True) -> Path:
    """``x`` and ``y`` as a user's CSV file: a column per feature, then ``label`` (a header line unless not)."""
    names = ",".join([f"f{i}" for i in range(x.shape[1])] + ["label"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=names if header else "", comments="",
               fmt=["%.7g"] * x.shape[1] + ["%d"])
    return path


def blobs(n: int, features: int = 4, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``classes`` Gaussian blobs, each shifted by its label: separable, so learnable."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    return (rng.standard_normal((n, features)) + y[:, None]).astype(np.float32), y
