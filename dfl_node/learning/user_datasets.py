"""A dataset of the user's own, as ``simulate``, ``testbed`` and ``partition`` share it out: the ``(train, test)``
pair every partition applies to, whatever ``--dataset`` names (:mod:`.dataset_refs`).

* A path: a ``.csv``, ``.npz`` or ``.safetensors`` file, or a folder of them, read as a node reads its own
  (:mod:`.data_files`, the same ``--label-column``, ``--sample-shape`` and ``--num-classes``). The global test
  set is the folder's ``test.*`` files; without one, a stratified 20 % held out with a fixed seed (as the
  embedded digits are split), the same whatever the experiment's seed.
* A recorded fleet (``--partition as-recorded``, :func:`load_recorded`): a folder of one subfolder (or file) per
  device, each device's data a node's, split into training and validation as a node started on it with ``--data``
  splits its own (:class:`~.local_data.LocalData`). No other partition reads a folder's subfolders: given one that
  holds some, it says so rather than pool the files at the top alone.
* A ``dfl_node.datasets`` plugin, or a ``package.module:factory``: a callable taking the ``--data-dir`` (a Path,
  or None) and returning ``(train, test)``, each an :class:`~.datasets.ArrayDataset` or a pair ``(x, y)`` of
  arrays (x: numbers of shape (N, *sample shape); y: N whole-number labels). It runs in this process, from this
  installation: nothing a peer sends names it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dfl_node.errors import InputError
from dfl_node.learning.data_files import Samples, from_arrays, is_data_file, read_samples, reshaped
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.dataset_refs import dataset_kind
from dfl_node.learning.datasets import ArrayDataset, load_dataset, stratified_split
from dfl_node.learning.local_data import TEST_STEM, LocalData, Reads
from dfl_node.plugins import PluginError, load_installed, resolve

TEST_FRACTION, TEST_SEED = 0.2, 0


def load_any_dataset(name: str, data_dir: Path | None, fmt: DataFormat,
                     reads: Reads = "classes") -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, test)`` of the dataset ``name`` names: built-in, plugin, reference or path; its ``y`` what the
    task ``reads`` (class labels, float targets, anomaly flags)."""
    kind = dataset_kind(name)
    if kind == "builtin":
        if reads != "classes":
            raise InputError(f"--dataset {name}: a built-in dataset of classes; a {reads} task needs data of its own "
                             "(docs/tasks.md)")
        return load_dataset(name, data_dir)
    if kind == "path":
        pool, test = _read_path(Path(name), fmt, reads)
    elif kind in ("plugin", "reference"):
        pool, test = _from_plugin(name, kind, data_dir, fmt, reads)
    else:
        raise InputError(f"unknown dataset {name!r}")
    return _as_datasets(pool, test, fmt, name, reads)


def _read_path(path: Path, fmt: DataFormat, reads: Reads) -> tuple[list[Samples], list[Samples]]:
    if not path.exists():
        raise InputError(f"--dataset {path}: no such file or folder")
    nested = [p.name for p in recorded_devices(path) if p.is_dir()] if path.is_dir() else []
    if nested:
        shown = ", ".join(nested[:3]) + (", …" if len(nested) > 3 else "")
        raise InputError(f"--dataset {path}: its subfolders hold data files ({shown}), which a partition of pooled "
                         f"files would not read; to run each subfolder (or file) as a device, give --partition "
                         f"as-recorded, or move their files to the top of the folder")
    files = sorted(p for p in path.iterdir() if is_data_file(p) and p.is_file()) if path.is_dir() else [path]
    if not files:
        raise InputError(f"--dataset {path}: no data file in it (.csv, .npz, .safetensors; see docs/data.md)")
    samples = {p: read_samples(p, fmt, targets=reads == "targets") for p in files}
    test = [s for p, s in samples.items() if path.is_dir() and _is_test(p)]
    pool = [s for p, s in samples.items() if not (path.is_dir() and _is_test(p))]
    if not pool:
        raise InputError(f"--dataset {path}: only test files in it, nothing to share out")
    return pool, test


def _from_plugin(name: str, kind: str, data_dir: Path | None, fmt: DataFormat,
                 reads: Reads) -> tuple[list[Samples], list[Samples]]:
    try:
        factory = load_installed("datasets", name) if kind == "plugin" else resolve(name)
    except PluginError as exc:
        raise InputError(str(exc)) from None
    try:
        made = factory(data_dir)
    except Exception as exc:  # the plugin's own failure, whatever it is: one line, not its traceback
        raise InputError(f"dataset {name} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(made, tuple | list) or len(made) != 2:
        raise InputError(f"dataset {name} must return (train, test), got {type(made).__name__}")
    parts = []
    for role, part in zip(("train", "test"), made):
        where = f"dataset {name}: {role}"
        if isinstance(part, ArrayDataset):
            parts.append(Samples(part.x.numpy(), part.y.numpy(), part.num_classes))
        elif isinstance(part, tuple | list) and len(part) == 2:
            parts.append(from_arrays(part[0], part[1], where, fmt.num_classes, targets=reads == "targets"))
        else:
            raise InputError(f"{where} must be an ArrayDataset or a pair (x, y) of arrays, got {type(part).__name__}")
    train, test = (reshaped(part, fmt.sample_shape, f"dataset {name}") for part in parts)
    return [train], [test]


def _as_datasets(pool: list[Samples], test: list[Samples], fmt: DataFormat, name: str,
                 reads: Reads = "classes") -> tuple[ArrayDataset, ArrayDataset]:
    everything = [*pool, *test]
    _same_shape({s.sample_shape for s in everything}, name)
    num_classes = _fleet_classes(everything, fmt, name, reads)
    x = np.concatenate([s.x for s in pool]) if len(pool) > 1 else pool[0].x
    y = np.concatenate([s.y for s in pool]) if len(pool) > 1 else pool[0].y
    if test:
        tx = np.concatenate([s.x for s in test]) if len(test) > 1 else test[0].x
        ty = np.concatenate([s.y for s in test]) if len(test) > 1 else test[0].y
    else:
        try:
            strata = np.zeros(len(y), np.int64) if reads == "targets" else y  # targets: one stratum
            train_idx, test_idx = stratified_split(strata, TEST_FRACTION, TEST_SEED)
        except ValueError as exc:
            raise InputError(f"--dataset {name}: no test file, and {exc}; add a test.csv (or test.npz)") from None
        x, y, tx, ty = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    return _dataset(x, y, num_classes), _dataset(tx, ty, num_classes)


def _fleet_classes(samples: list[Samples], fmt: DataFormat, name: object, reads: Reads) -> int:
    """The fleet's number of classes (of targets, with float targets; 2 with anomaly flags): given, else what the
    files declare, else the largest label + 1; every sample is checked against it."""
    if reads == "targets":
        counts = {s.num_classes for s in samples}
        if len(counts) > 1:
            raise InputError(f"--dataset {name}: its files hold different numbers of targets "
                             f"({', '.join(map(str, sorted(c or 0 for c in counts)))})")
        return int(counts.pop() or 1)
    declared = {s.num_classes for s in samples if s.num_classes}
    num_classes = 2 if reads == "flags" else fmt.num_classes or (declared.pop() if len(declared) == 1 else 0)
    num_classes = num_classes or int(max(int(s.y.max(initial=-1)) for s in samples)) + 1
    for s in samples:
        if len(s) and int(s.y.max()) >= num_classes:
            what = "an anomaly flag (0 normal, 1 anomalous)" if reads == "flags" else (
                f"one of its {num_classes} classes")
            raise InputError(f"--dataset {name}: label {int(s.y.max())} is not {what}")
    return num_classes


def _dataset(x: np.ndarray, y: np.ndarray, num_classes: int) -> ArrayDataset:
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)),
                        num_classes)


def _same_shape(shapes: set[tuple[int, ...]], name: object) -> None:
    """A fleet's samples have one shape, or no model reads them all."""
    if len(shapes) > 1:
        raise InputError(f"--dataset {name}: its samples differ in shape ({', '.join(map(str, sorted(shapes)))})")


def _is_test(path: Path) -> bool:
    """A test set's file (``test.*``) of a data folder: the global test set, never a node's."""
    return is_data_file(path) and path.stem.lower() == TEST_STEM and path.is_file()


def _holds_data(folder: Path) -> bool:
    return any(is_data_file(p) and p.is_file() for p in folder.iterdir())


def recorded_devices(folder: Path) -> list[Path]:
    """The devices of a recorded fleet's ``folder``, in the order of their names (node i is the i-th): each
    subfolder that holds data files, and each data file at its top but a test set's. Hidden entries (``.name``)
    are none, as a node's data folder skips hidden files (a file being written)."""
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    return [p for p in entries
            if (p.is_dir() and _holds_data(p)) or (is_data_file(p) and p.is_file() and not _is_test(p))]


def load_recorded(folder: Path, fmt: DataFormat, *, val_fraction: float, seed: int,
                  reads: Reads = "classes") -> tuple[list[tuple[ArrayDataset, ArrayDataset]], ArrayDataset]:
    """Each device's ``(train, val)`` of a recorded fleet (:func:`recorded_devices`), and the global test set.

    A device is read as a node started with ``--data DEVICE --val-fraction F --seed S`` reads its own
    (:class:`~.local_data.LocalData`): its ``val.*`` files validate, else each file holds back ``val_fraction``
    of every class; so a simulated node holds what that device's daemon would. The global test set is the
    ``test.*`` files of the folder and of its devices' folders (a node never trains on one); without any, the
    devices' validation sets together, the fleet's held-out data. The number of classes is the fleet's
    (``fmt.num_classes``, else the most any device or test file has), so that every node builds the same model."""
    devices = recorded_devices(folder)
    if not devices:
        raise InputError(f"--dataset {folder}: no device in it (a subfolder of data files, or a data file, each; "
                         f"see docs/data.md)")
    parts = []
    for device in devices:
        nested = [p.name for p in recorded_devices(device) if p.is_dir()] if device.is_dir() else []
        if nested:
            raise InputError(f"--dataset {folder}, device {device.name}: its subfolders hold data files "
                             f"({', '.join(nested)}), which its node would not read; move their files to the top of "
                             f"{device}")
        try:
            view = LocalData(device, fmt, val_fraction=val_fraction, max_samples=0, seed=seed, reads=reads).load()
        except InputError as exc:
            raise InputError(f"--dataset {folder}, device {device.name}: {exc}") from None
        if not len(view.val):
            raise InputError(f"--dataset {folder}, device {device.name}: {len(view.train)} samples, too few to hold "
                             f"{val_fraction:g} of them back for local validation")
        parts.append((view.train, view.val))
    files = [p for d in (folder, *(d for d in devices if d.is_dir())) for p in sorted(d.iterdir()) if _is_test(p)]
    tests = [read_samples(p, fmt, targets=reads == "targets") for p in files]
    _same_shape({train.input_shape for train, _ in parts} | {s.sample_shape for s in tests}, folder)
    if reads == "classes":
        num_classes = fmt.num_classes or max([train.num_classes for train, _ in parts] +
                                             [s.num_classes or int(s.y.max(initial=-1)) + 1 for s in tests])
    else:  # targets: every device's and test file's count; flags: 2
        recorded = [Samples(train.x.numpy(), train.y.numpy(), train.num_classes) for train, _ in parts]
        num_classes = _fleet_classes([*recorded, *tests], fmt, folder, reads)
    fleet = [(ArrayDataset(train.x, train.y, num_classes), ArrayDataset(val.x, val.y, num_classes))
             for train, val in parts]
    if not tests:
        return fleet, ArrayDataset(torch.cat([val.x for _, val in fleet]), torch.cat([val.y for _, val in fleet]),
                                   num_classes)
    return fleet, _dataset(np.concatenate([s.x for s in tests]), np.concatenate([s.y for s in tests]), num_classes)
