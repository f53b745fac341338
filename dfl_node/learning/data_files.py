"""One data file of a user's → its samples, checked: ``.csv`` (:mod:`.csv_reader`), ``.npz`` (arrays ``x`` and
``y``) or ``.safetensors`` (a shard as ``dfl-node partition`` writes it: :func:`~.datasets.load_shard`).

Every problem is an :class:`~dfl_node.errors.InputError` of one line naming the file and, where there is one,
the row (CSV) or sample (``x[17]``): a node refuses it at start, and skips the file while it runs. Nothing is
unpickled (``allow_pickle=False``; safetensors holds no code).
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dfl_node.errors import InputError
from dfl_node.learning.csv_reader import read_csv, read_series
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.dataset_refs import DATA_SUFFIXES as SUFFIXES
from dfl_node.learning.datasets import load_shard
from dfl_node.learning.windows import windows


@dataclass(frozen=True)
class Samples:
    """A file's samples: float32 ``x`` of shape (N, *sample shape), int64 labels ``y`` (N,), or float32 targets
    ``y`` (N, T) (a regression task's)."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int | None = None  # what the file declares (a shard's metadata), or T; None: it declares none
    starts: np.ndarray | None = None  # a time series' windows (:mod:`.windows`): each one's first step
    steps: int = 0  # a time series' length, in steps

    @property
    def targets(self) -> bool:
        """Whether ``y`` holds float targets, not class labels."""
        return self.y.dtype == np.float32

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


def is_data_file(path: Path) -> bool:
    """A file a data folder's reader takes: one of :data:`SUFFIXES`, not hidden (``.name``), so that a writer can
    put a file in place atomically (write ``data.csv.tmp`` or ``.data.csv``, then rename it)."""
    return path.suffix.lower() in SUFFIXES and not path.name.startswith(".")


def read_samples(path: Path, fmt: DataFormat, *, num_classes: int | None = None,
                 complete_lines: bool = False, targets: bool = False) -> Samples:
    """The samples of ``path``, reshaped to ``fmt.sample_shape`` if given, labels checked against ``num_classes``
    (else ``fmt.num_classes``, else what the file declares); with ``targets``, float targets (a regression task's:
    ``fmt.target_column``, else the label column), as many as ``num_classes`` says if given.
    ``complete_lines``: see :func:`read_csv`."""
    classes = num_classes or (None if targets else fmt.num_classes)
    suffix = path.suffix.lower()
    if fmt.window is not None and suffix == ".csv":  # a series; a shard or an .npz file holds samples already
        return _read_windows(path, fmt, targets, complete_lines)
    try:
        if suffix == ".csv":
            columns = (fmt.target_column or [fmt.label_column]) if targets else ()
            table = read_csv(path, fmt.label_column, num_classes=None if targets else classes,
                             complete_lines=complete_lines, targets=columns)
            samples = Samples(table.x, table.y, table.y.shape[1] if targets else None)
        elif suffix == ".npz":
            samples = _read_npz(path, targets)
        elif suffix == ".safetensors":
            samples = _read_safetensors(path)
        else:
            raise InputError(f"{path}: not a data file (its name must end in {', '.join(SUFFIXES)})")
    except OSError as exc:  # gone since the folder was listed, or not readable
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if samples.targets != targets:
        raise InputError(f"{path}: holds {'float targets' if samples.targets else 'class labels'}, but the task "
                         f"{'is regression' if targets else 'wants class labels'}")
    what = "targets" if targets else "classes"
    if classes and samples.num_classes and samples.num_classes != classes:
        raise InputError(f"{path}: its {'y' if targets else 'metadata'} says {samples.num_classes} {what}, this "
                         f"node has {classes}")
    if not targets:
        _check_labels(samples.y, classes or samples.num_classes, path)
    return reshaped(samples, fmt.sample_shape, path)


def _read_windows(path: Path, fmt: DataFormat, targets: bool, complete_lines: bool) -> Samples:
    """A device's time series, a CSV file, as its forecasting windows (:mod:`.windows`)."""
    assert fmt.window is not None
    if not targets:
        raise InputError(f"{path}: --window makes forecasting samples of a series: it needs --task regression")
    try:
        series, columns = read_series(path, fmt.target_column, complete_lines=complete_lines)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    x, y, starts = windows(series, columns, fmt.window, fmt.horizon, fmt.stride)
    return Samples(x, y, y.shape[1], starts, len(series))


def from_arrays(x: object, y: object, where: str, num_classes: int | None = None, targets: bool = False) -> Samples:
    """Samples from arrays a user's code handed over (a dataset plugin), checked as a file's are: ``y`` N labels,
    or with ``targets`` N (or N x T) float targets."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind not in "biuf" or x.ndim < 1 or y.ndim not in ((1, 2) if targets else (1,)) or len(x) != len(y):
        wanted = "N or N x T targets" if targets else "N labels"
        raise InputError(f"{where}: x must be an array of numbers (N, *sample shape) and y {wanted}, got "
                         f"{x.dtype} {x.shape} and {y.dtype} {y.shape}")
    if not len(x):
        raise InputError(f"{where}: no samples")
    features = np.ascontiguousarray(x, dtype=np.float32)
    _check_finite(features, where)
    features = features if features.ndim > 1 else features[:, None]
    if targets:
        if y.dtype.kind not in "biuf":
            raise InputError(f"{where}: y must be numbers (the targets), got {y.dtype}")
        values = np.ascontiguousarray(y.reshape(len(y), -1), dtype=np.float32)
        _check_finite(values, where, "y")
        return Samples(features, values, values.shape[1])
    labels = _labels(y, where)
    _check_labels(labels, num_classes, where)
    return Samples(features, labels)


def _read_npz(path: Path, targets: bool) -> Samples:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            if not isinstance(arrays, np.lib.npyio.NpzFile):
                raise InputError(f"{path}: a single .npy array, not an .npz archive of x and y (np.savez)")
            if not {"x", "y"} <= set(arrays.files):
                raise InputError(f"{path}: an .npz file needs arrays x and y (np.savez(path, x=..., y=...)), it "
                                 f"holds {', '.join(sorted(arrays.files)) or 'none'}")
            x, y = arrays["x"], arrays["y"]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{path}: not a readable .npz file ({' '.join(str(exc).split())[:200]})") from None
    return from_arrays(x, y, str(path), targets=targets)


def _read_safetensors(path: Path) -> Samples:
    try:
        shard = load_shard(path)
    except (OSError, ValueError) as exc:
        raise InputError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    x = shard.x.numpy()
    _check_finite(x, str(path))
    return Samples(x, shard.y.numpy(), shard.num_classes)


def _labels(y: np.ndarray, where: str) -> np.ndarray:
    """Labels as int64: integers, or floats that are whole numbers (a CSV written by numpy's savetxt)."""
    if y.ndim != 1 or y.dtype.kind not in "iuf":
        raise InputError(f"{where}: y must be N whole-number labels, got {y.dtype} {y.shape}")
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.floor(y)))
        if bad.size:
            raise InputError(f"{where}: y[{bad[0]}] = {y[bad[0]]} is not a class number (0, 1, 2, …)")
    return y.astype(np.int64)


def _check_labels(y: np.ndarray, num_classes: int | None, where: object) -> None:
    top = num_classes or math.inf
    bad = np.flatnonzero((y < 0) | (y >= top))
    if bad.size:
        classes = f"0..{num_classes - 1}" if num_classes else "0, 1, 2, …"
        raise InputError(f"{where}: y[{bad[0]}] = {y[bad[0]]} is not one of the classes ({classes})")


def _check_finite(x: np.ndarray, where: str, name: str = "x") -> None:
    if not x.size:  # no samples (or none with values): nothing to check
        return
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():
        raise InputError(f"{where}: {name}[{np.flatnonzero(~finite)[0]}] holds NaN or an infinity")


def reshaped(samples: Samples, shape: tuple[int, ...] | None, where: object) -> Samples:
    """``samples`` with each sample reshaped to ``shape`` (None: as they are); the number of values must match."""
    if shape is None or samples.sample_shape == shape:
        return samples
    if math.prod(samples.sample_shape) != math.prod(shape):
        raise InputError(f"{where}: a sample holds {math.prod(samples.sample_shape)} values "
                         f"{samples.sample_shape}; --sample-shape {','.join(map(str, shape))} needs "
                         f"{math.prod(shape)}")
    return Samples(samples.x.reshape(len(samples), *shape), samples.y, samples.num_classes)
