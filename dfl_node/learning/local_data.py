"""A node's own data (``--data``): a file, or a folder of files, as its training and validation sets; read at
start, and again whenever :mod:`dfl_node.node.model.data_watch` sees the folder change.

A folder's files are its ``.csv``, ``.npz`` and ``.safetensors`` files (:func:`~.data_files.is_data_file`), in
the order they were last modified. ``val.*`` files are its validation set; ``test.*`` files are never read (the
global test set is ``--test-data``). Without a validation file, each file holds back ``val_fraction`` of its
samples (:func:`holdout`): in every class, in file order, so the share is exact to one sample per class and file,
seeded, and stable as the file grows — a sample never moves between training and validation; the rows are
reordered in place (:func:`split_rows`), so that a file's training and validation sets are views of its arrays as
read: a node holds its data once. ``max_samples`` keeps the newest samples of the training files. A shard folder
of ``dfl-node partition`` (``train.safetensors``, ``val.safetensors``) is the case of one training file and one
validation file: read as it always was, bit for bit.

At start (:meth:`LocalData.load`) a bad file stops the node with its one line; later (:meth:`LocalData.refresh`)
a bad version of a file is skipped, and the samples the node had from that file stay.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from dfl_node.errors import InputError
from dfl_node.learning.data_files import Samples, is_data_file, read_samples
from dfl_node.learning.data_format import DataFormat
from dfl_node.learning.datasets import ArrayDataset
from dfl_node.learning.windows import period_split

VAL_STEM, TEST_STEM = "val", "test"
Reads = Literal["classes", "targets", "flags"]  # what a sample's y is: a task's (dfl_node.learning.tasks.Task.reads)


@dataclass(frozen=True)
class Version:
    """What a cheap look at a file sees: its modification time and size."""

    mtime_ns: int
    size: int


@dataclass(frozen=True)
class _File:
    """A file as last read well."""

    version: Version
    samples: Samples  # where the file was split: its training samples first, then its held-out ones (file order)
    held: np.ndarray | None  # where it was split (a folder without a val.* file): the hold-out, in file order
    validation: bool  # a val.* file: every sample validates

    @property
    def training(self) -> int:
        """How many of its samples (the first ones) train."""
        return len(self.samples) if self.held is None else int(np.count_nonzero(~self.held))


@dataclass
class DataView:
    """The node's data as read now, and the files skipped (name → the one line that says why)."""

    train: ArrayDataset
    val: ArrayDataset
    files: int
    skipped: dict[str, str] = field(default_factory=dict)


def holdout(y: np.ndarray, fraction: float, seed: int, key: str) -> np.ndarray:
    """Which samples of a file validate: the k-th sample of class c (in file order) when ⌊(k+1)·f + φ⌋ > ⌊k·f + φ⌋,
    φ ∈ [0, 1) drawn from (``seed``, ``key``, c). Stratified (every class holds back f of its samples, to one),
    seeded, and a function of k alone, so samples appended to the file never change an earlier sample's side."""
    held = np.zeros(len(y), bool)
    if fraction <= 0 or not len(y):
        return held
    order = np.argsort(y, kind="stable")
    ordered = y[order]
    classes, starts = np.unique(ordered, return_index=True)
    group = np.searchsorted(classes, ordered)
    rank = (np.arange(len(y)) - starts[group]).astype(np.float64)
    phase = np.array([_phase(seed, key, int(c)) for c in classes])[group]
    held[order] = np.floor((rank + 1) * fraction + phase) > np.floor(rank * fraction + phase)
    return held


def split_rows(x: np.ndarray, y: np.ndarray, held: np.ndarray, chunk: int = 1 << 16) -> None:
    """Reorder ``x`` and ``y`` in place: the rows not ``held`` first, then the held ones, each in their order. It
    takes a copy of the held rows and of one chunk, not of the data: the training set is then a view of the rows
    as read (a node's data in memory once, not twice)."""
    held_x, held_y = x[held], y[held]
    filled = 0
    for start in range(0, len(held), chunk):
        kept = ~held[start:start + chunk]
        count = int(np.count_nonzero(kept))
        # rows from filled ≤ start on: those before start have moved, this chunk's are copied by the mask first
        x[filled:filled + count] = x[start:start + chunk][kept]
        y[filled:filled + count] = y[start:start + chunk][kept]
        filled += count
    x[filled:], y[filled:] = held_x, held_y


def _phase(seed: int, key: str, label: int) -> float:
    digest = hashlib.sha256(f"{seed}\x1f{key}\x1f{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class LocalData:
    """The files of ``path`` (a data file or a folder of them) as a node's training and validation sets."""

    def __init__(self, path: Path, fmt: DataFormat, *, val_fraction: float, max_samples: int, seed: int,
                 reads: Reads = "classes") -> None:
        self.path, self.fmt = path, fmt
        self.targets = reads == "targets"  # float targets (regression), not labels
        self.val_fraction, self.max_samples, self.seed = val_fraction, max_samples, seed
        # with targets: how many (T); flags (anomaly): normal 0, anomalous 1, whatever a device has seen
        self.num_classes: int | None = None if self.targets else 2 if reads == "flags" else fmt.num_classes
        self.classes_inferred = False  # num_classes from the largest label (the operator gave none)
        self.sample_shape: tuple[int, ...] = ()
        self._files: dict[str, _File] = {}
        self._bad: dict[str, tuple[Version, str]] = {}  # name → the version that failed, and why
        self.seen: dict[str, Version] = {}  # the versions the last load or refresh was given

    @property
    def folder(self) -> Path:
        return self.path if self.path.is_dir() else self.path.parent

    def scan(self) -> dict[str, Version]:
        """Each data file's version, by name: a directory listing and a stat per file, nothing read."""
        if self.path.is_dir():
            paths: Iterable[Path] = (p for p in self.path.iterdir()
                                     if is_data_file(p) and p.stem.lower() != TEST_STEM and p.is_file())
        else:
            paths = [self.path]
        versions = {}
        for path in paths:
            try:
                stat = path.stat()
            except FileNotFoundError:  # gone between the listing and the stat
                continue
            versions[path.name] = Version(stat.st_mtime_ns, stat.st_size)
        return versions

    def load(self) -> DataView:
        """Read every file, strictly: the first problem is an :class:`InputError` (the node does not start)."""
        if not self.path.exists():
            raise InputError(f"--data {self.path}: no such file or folder")
        versions = self.seen = self.scan()
        if not versions:
            raise InputError(f"--data {self.path}: no data file in it (.csv, .npz, .safetensors; see docs/data.md)")
        split = not self._has_validation(versions)
        for name, version in sorted(versions.items()):
            self._files[name] = self._read(name, version, complete_lines=False, split=split)
        self._settle_classes()
        first = min(self._files, key=lambda name: (self._files[name].version.mtime_ns, name))
        self.sample_shape = self._files[first].samples.sample_shape
        for name, entry in self._files.items():
            self._check_shape(name, entry.samples)
        view = self._view()
        if not len(view.train):
            raise InputError(f"--data {self.path}: no training samples (only validation files, or too few samples "
                             f"to hold {self.val_fraction:g} of them back)")
        return view

    def refresh(self, versions: dict[str, Version]) -> tuple[DataView | None, list[str]]:
        """The data after the files changed to ``versions`` (None: nothing usable changed), and the problems of the
        file versions that failed now (each is skipped, and named once: a version that failed is not read again)."""
        changed, problems = False, []
        self.seen = versions
        for name in set(self._files) - set(versions):
            del self._files[name]
            changed = True
        for name in set(self._bad) - set(versions):
            del self._bad[name]
        split = not self._has_validation(versions)  # a val.* file came or went: the training files read again
        for name, version in sorted(versions.items()):
            known = self._files.get(name)
            as_read = known is not None and known.version == version and (known.validation or
                                                                           (known.held is not None) == split)
            if as_read or self._bad.get(name, (None,))[0] == version:
                continue
            try:
                entry = self._read(name, version, complete_lines=True, split=split)
                self._check_shape(name, entry.samples)
            except InputError as exc:
                self._bad[name] = version, str(exc)
                problems.append(str(exc))
                continue
            self._files[name] = entry
            self._bad.pop(name, None)
            changed = True
        if not changed:
            return None, problems
        view = self._view()
        if not len(view.train):
            problems.append(f"{self.path}: no training samples left in it; keeping the data read before")
            return None, problems
        return view, problems

    @property
    def skipped(self) -> dict[str, str]:
        return {name: problem for name, (_, problem) in sorted(self._bad.items())}

    def _has_validation(self, versions: dict[str, Version]) -> bool:
        return self.path.is_dir() and any(Path(name).stem.lower() == VAL_STEM for name in versions)

    def _read(self, name: str, version: Version, *, complete_lines: bool, split: bool) -> _File:
        """Read a file; ``split``: hold back its share of validation samples (a training file of a folder that has
        no val.* file). Its arrays are read anew, so they are reordered in place (:func:`split_rows`)."""
        samples = read_samples(self.folder / name, self.fmt, num_classes=self.num_classes,
                               complete_lines=complete_lines, targets=self.targets)
        validation = self.path.is_dir() and Path(name).stem.lower() == VAL_STEM
        if self.max_samples and len(samples) > self.max_samples and not validation:  # never more of it is kept
            keep = slice(len(samples) - self.max_samples, None)
            samples = replace(samples, x=samples.x[keep].copy(), y=samples.y[keep].copy(),
                              starts=None if samples.starts is None else samples.starts[keep])
        held = None
        if split and not validation and samples.starts is not None:  # a series: its last period validates
            assert self.fmt.window is not None
            train, val = period_split(samples.starts, samples.steps, self.fmt.window, self.fmt.horizon,
                                      self.val_fraction)
            keep = train | val  # a window across the boundary is in neither
            samples = replace(samples, x=samples.x[keep], y=samples.y[keep], starts=samples.starts[keep])
            held = val[keep]  # the validation windows are the last ones already: no reordering
        elif split and not validation:
            strata = np.zeros(len(samples), np.int64) if self.targets else samples.y  # targets: one stratum
            held = holdout(strata, self.val_fraction, self.seed, name)
            split_rows(samples.x, samples.y, held)
        return _File(version, samples, held, validation)

    def _settle_classes(self) -> None:
        """The number of classes: given, else what the files declare (a shard's metadata), else the largest
        label + 1 (:attr:`classes_inferred`); every file's labels are then checked against it."""
        if self.num_classes is not None:
            return
        declared = {e.samples.num_classes for e in self._files.values() if e.samples.num_classes}
        if self.targets:
            if len(declared) > 1:
                raise InputError(f"--data {self.path}: its files hold different numbers of targets "
                                 f"({', '.join(map(str, sorted(declared)))})")
            self.num_classes = declared.pop()
            return
        if len(declared) > 1:
            raise InputError(f"--data {self.path}: its files declare different numbers of classes "
                             f"({', '.join(map(str, sorted(declared)))}); give --num-classes")
        if declared:
            self.num_classes = declared.pop()
            for name, entry in self._files.items():  # read again to name the sample (or row) whose label is out
                if len(entry.samples) and int(entry.samples.y.max()) >= self.num_classes:
                    self._read(name, entry.version, complete_lines=False, split=False)
            return
        top = max(int(e.samples.y.max()) for e in self._files.values())
        if top < 1:
            raise InputError(f"--data {self.path}: every label is 0, a single class; give --num-classes")
        self.num_classes, self.classes_inferred = top + 1, True

    def _check_shape(self, name: str, samples: Samples) -> None:
        if samples.sample_shape != self.sample_shape:
            raise InputError(f"{self.folder / name}: samples of shape {samples.sample_shape}, this node's data has "
                             f"{self.sample_shape}")

    def _view(self) -> DataView:
        """The files, oldest first, as the training and validation sets, each file's part a view of its arrays;
        ``max_samples`` keeps the newest samples of the training files (the hold-out of those kept validates)."""
        order = sorted(self._files, key=lambda name: (self._files[name].version.mtime_ns, name))
        budget, takes = self.max_samples or math.inf, {}
        for name in reversed(order):  # newest first
            if not self._files[name].validation:
                takes[name] = int(min(len(self._files[name].samples), budget))
                budget -= takes[name]
        train, val = [], []
        for name in order:
            entry = self._files[name]
            x, y, n = entry.samples.x, entry.samples.y, len(entry.samples)
            if entry.validation:
                val.append((x, y))
                continue
            tail = np.zeros(takes[name], bool) if entry.held is None else entry.held[n - takes[name]:]
            end, kept, held = entry.training, int(np.count_nonzero(~tail)), int(np.count_nonzero(tail))
            train.append((x[end - kept:end], y[end - kept:end]))
            val.append((x[n - held:], y[n - held:]))
        return DataView(self._dataset(train), self._dataset(val), len(order), self.skipped)

    def _dataset(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> ArrayDataset:
        assert self.num_classes is not None
        parts = [part for part in parts if len(part[1])]
        if len(parts) == 1:  # one file: a view of its arrays (a shard's tensors, bit for bit)
            x, y = parts[0]
        elif parts:
            x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        else:
            x = np.empty((0, *self.sample_shape), np.float32)
            y = np.empty((0, self.num_classes), np.float32) if self.targets else np.empty(0, np.int64)
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)),
                            self.num_classes)


def read_test_set(path: Path, fmt: DataFormat, num_classes: int, sample_shape: tuple[int, ...],
                  targets: bool = False) -> ArrayDataset:
    """The global test set (``--test-data``): one data file of the node's classes (targets) and sample shape."""
    if not path.is_file():
        raise InputError(f"--test-data {path}: no such file")
    samples = read_samples(path, fmt, num_classes=num_classes, targets=targets)
    if samples.sample_shape != sample_shape:
        raise InputError(f"{path}: samples of shape {samples.sample_shape}, this node's data has {sample_shape}")
    return ArrayDataset(torch.from_numpy(samples.x), torch.from_numpy(samples.y), num_classes)
