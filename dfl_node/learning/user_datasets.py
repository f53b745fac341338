"""A dataset of the user's own, as ``simulate``, ``testbed`` and ``partition`` share it out: the ``(train, test)``
pair every partition applies to, whatever ``--dataset`` names (:mod:`.dataset_refs`).

* A path: a ``.csv``, ``.npz`` or ``.safetensors`` file, or a folder of them, read as a node reads its own
  (:mod:`.data_files`, the same ``--label-column``, ``--sample-shape`` and ``--num-classes``). The global test
  set is the folder's ``test.*`` files; without one, a stratified 20 % held out with a fixed seed (as the
  embedded digits are split), the same whatever the experiment's seed.
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
from dfl_node.learning.local_data import TEST_STEM
from dfl_node.plugins import PluginError, load_installed, resolve

TEST_FRACTION, TEST_SEED = 0.2, 0


def load_any_dataset(name: str, data_dir: Path | None, fmt: DataFormat) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, test)`` of the dataset ``name`` names: built-in, plugin, reference or path."""
    kind = dataset_kind(name)
    if kind == "builtin":
        return load_dataset(name, data_dir)
    if kind == "path":
        pool, test = _read_path(Path(name), fmt)
    elif kind in ("plugin", "reference"):
        pool, test = _from_plugin(name, kind, data_dir, fmt)
    else:
        raise InputError(f"unknown dataset {name!r}")
    return _as_datasets(pool, test, fmt, name)


def _read_path(path: Path, fmt: DataFormat) -> tuple[list[Samples], list[Samples]]:
    if not path.exists():
        raise InputError(f"--dataset {path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if is_data_file(p) and p.is_file()) if path.is_dir() else [path]
    if not files:
        raise InputError(f"--dataset {path}: no data file in it (.csv, .npz, .safetensors; see docs/data.md)")
    samples = {p: read_samples(p, fmt) for p in files}
    test = [s for p, s in samples.items() if path.is_dir() and p.stem.lower() == TEST_STEM]
    pool = [s for p, s in samples.items() if not (path.is_dir() and p.stem.lower() == TEST_STEM)]
    if not pool:
        raise InputError(f"--dataset {path}: only test files in it, nothing to share out")
    return pool, test


def _from_plugin(name: str, kind: str, data_dir: Path | None,
                 fmt: DataFormat) -> tuple[list[Samples], list[Samples]]:
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
            parts.append(from_arrays(part[0], part[1], where, fmt.num_classes))
        else:
            raise InputError(f"{where} must be an ArrayDataset or a pair (x, y) of arrays, got {type(part).__name__}")
    train, test = (reshaped(part, fmt.sample_shape, f"dataset {name}") for part in parts)
    return [train], [test]


def _as_datasets(pool: list[Samples], test: list[Samples], fmt: DataFormat,
                 name: str) -> tuple[ArrayDataset, ArrayDataset]:
    everything = [*pool, *test]
    shapes = {s.sample_shape for s in everything}
    if len(shapes) > 1:
        raise InputError(f"--dataset {name}: its samples differ in shape ({', '.join(map(str, sorted(shapes)))})")
    declared = {s.num_classes for s in everything if s.num_classes}
    num_classes = fmt.num_classes or (declared.pop() if len(declared) == 1 else 0)
    num_classes = num_classes or int(max(int(s.y.max()) for s in everything)) + 1
    for s in everything:
        if int(s.y.max()) >= num_classes:
            raise InputError(f"--dataset {name}: label {int(s.y.max())} is not one of its {num_classes} classes")
    x = np.concatenate([s.x for s in pool]) if len(pool) > 1 else pool[0].x
    y = np.concatenate([s.y for s in pool]) if len(pool) > 1 else pool[0].y
    if test:
        tx = np.concatenate([s.x for s in test]) if len(test) > 1 else test[0].x
        ty = np.concatenate([s.y for s in test]) if len(test) > 1 else test[0].y
    else:
        try:
            train_idx, test_idx = stratified_split(y, TEST_FRACTION, TEST_SEED)
        except ValueError as exc:
            raise InputError(f"--dataset {name}: no test file, and {exc}; add a test.csv (or test.npz)") from None
        x, y, tx, ty = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    return _dataset(x, y, num_classes), _dataset(tx, ty, num_classes)


def _dataset(x: np.ndarray, y: np.ndarray, num_classes: int) -> ArrayDataset:
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)),
                        num_classes)
