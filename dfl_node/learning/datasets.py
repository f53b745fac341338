"""Datasets held in memory as normalized tensors, read only from local files.

Nodes run on machines without internet access, so nothing here ever downloads:
``digits`` ships inside this package (``data/digits.npz``), MNIST / Fashion-MNIST come from an ``.npz`` (arrays
``x_train y_train x_test y_test``) or the official IDX files, and CIFAR-10 from the official
``cifar-10-batches-py`` / ``cifar-10-batches-bin`` folders. A node's private data
travels as a safetensors shard (no pickle), validated on load.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dfl_node.errors import OperatorError
from dfl_node.learning.dataset_refs import BUILTIN_DATASETS as DATASETS

# Per-channel mean and std of each training set (checked against the real data).
_STATS = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_SUBDIRS = {"mnist": ("mnist", "MNIST/raw", "."),
            "fashion_mnist": ("fashion_mnist", "fashion-mnist", "FashionMNIST/raw", ".")}
_DIGITS_SEED = 0  # fixed so every node of a fleet sees the same digits train/test split
# scikit-learn's load_digits as uint8 arrays, images (1797, 8, 8) of pixels 0-16 and labels (1797,), shipped as
# package data: a node needs neither scikit-learn nor a download (tests/test_datasets.py checks its sha256).
DIGITS_FILE = Path(__file__).with_name("data") / "digits.npz"


@dataclass(frozen=True)
class ArrayDataset:
    """Samples and labels held in memory as tensors (a device's data fits in memory: no lazy loading needed).

    A sample has any shape: a feature vector (F,), a window of sensor channels (C, L), an image (C, H, W).
    """

    x: torch.Tensor  # float32, (N, *sample shape), already normalized
    y: torch.Tensor  # int64 (N,): labels (an anomaly task's: flags, 1 anomalous); or float32 (N, T): T targets
    num_classes: int  # the labels' classes; with float targets, T

    def __post_init__(self) -> None:
        if self.x.dtype != torch.float32 or self.x.ndim < 2:
            raise ValueError(f"x must be float32 (N, *sample shape), got {self.x.dtype} {tuple(self.x.shape)}")
        labels = self.y.dtype == torch.int64 and self.y.ndim == 1
        targets = self.y.dtype == torch.float32 and self.y.ndim == 2 and self.y.shape[1] == self.num_classes
        if not (labels or targets) or len(self.y) != len(self.x):
            raise ValueError(f"y must be int64 (N,) labels or float32 (N, {self.num_classes}) targets with "
                             f"N={len(self.x)}, got {self.y.dtype} {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> ArrayDataset:
        """Rows at ``indices`` (a copy), e.g. one client's partition."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64)) if not torch.is_tensor(indices) else indices.long()
        return ArrayDataset(self.x[idx], self.y[idx], self.num_classes)

    def to(self, device: torch.device | str) -> ArrayDataset:
        """The same data on ``device`` (this dataset where it is there already): a node's data is moved
        to its device once, not batch by batch."""
        x, y = self.x.to(device), self.y.to(device)
        return self if x is self.x and y is self.y else ArrayDataset(x, y, self.num_classes)

    @functools.cached_property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: (F,), (C, L), (C, H, W)… (kept: every Hello a node sends says it)"""
        return tuple(int(d) for d in self.x.shape[1:])

    @property
    def targets(self) -> bool:
        """Whether ``y`` holds float targets (a regression task's), not labels."""
        return self.y.dtype == torch.float32

    def class_counts(self) -> np.ndarray:
        """Samples per class (length ``num_classes``); DFML's WSM loss needs the proportions."""
        return np.bincount(self.y.cpu().numpy(), minlength=self.num_classes)


class DatasetNotFoundError(OperatorError, FileNotFoundError):
    """The dataset files are not on this machine; the message says where we looked and how to get them."""


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """The explicit argument, else ``$DFL_DATA_DIR``, else None (only ``digits`` works then)."""
    if data_dir is None:
        data_dir = os.environ.get("DFL_DATA_DIR") or None
    return None if data_dir is None else Path(data_dir).expanduser()


def load_dataset(name: str, data_dir: str | Path | None = None) -> tuple[ArrayDataset, ArrayDataset]:
    """Load ``(train, test)`` for one of ``DATASETS``; raises DatasetNotFoundError, never downloads."""
    key = name.lower().replace("-", "_")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if key == "digits":
        return _load_digits()
    root = resolve_data_dir(data_dir)
    if root is None:
        raise DatasetNotFoundError(f"dataset {key!r} needs a data directory: pass --data-dir or set DFL_DATA_DIR "
                                   "(the folder holding mnist.npz / fashion_mnist.npz); 'digits' needs none")
    if key == "cifar10":
        return _load_cifar10(root)
    return _load_mnist_like(key, root)


def _to_dataset(images: np.ndarray, labels: np.ndarray, key: str) -> ArrayDataset:
    """uint8 (N, C, H, W) -> per-channel standardized float32, so training sees zero-mean inputs."""
    mean, std = (np.asarray(s, dtype=np.float32).reshape(1, -1, 1, 1) for s in _STATS[key])
    x = (images.astype(np.float32) / 255.0 - mean) / std
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(labels.astype(np.int64)), 10)


def _load_digits() -> tuple[ArrayDataset, ArrayDataset]:
    """The embedded 8x8 digits (scikit-learn's), scaled to [0, 1]; stratified 80/20 with a fixed seed."""
    with np.load(DIGITS_FILE, allow_pickle=False) as arrays:
        images, labels = arrays["images"], arrays["labels"]
    x = (images / 16.0).astype(np.float32)[:, None]
    y = labels.astype(np.int64)
    train, test = stratified_split(y, test_fraction=0.2, seed=_DIGITS_SEED)
    mk = lambda i: ArrayDataset(torch.from_numpy(np.ascontiguousarray(x[i])), torch.from_numpy(y[i]), 10)  # noqa: E731
    return mk(train), mk(test)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices, each class split in proportion, shuffled: the indices of scikit-learn's
    ``train_test_split(..., test_size=test_fraction, stratify=labels, random_state=seed)`` (its
    StratifiedShuffleSplit, same draws from the same ``RandomState``), so the digits split is the one it made."""
    n_test = math.ceil(test_fraction * len(labels))
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.min() < 2 or min(n_test, len(labels) - n_test) < len(classes):
        raise ValueError(f"cannot split {len(labels)} labels {test_fraction:g} stratified: too few of a class")
    by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_train = _apportion(counts, len(labels) - n_test, rng)
    n_tested = _apportion(counts - n_train, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for members, k, t in zip(by_class, n_train, n_tested):
        members = members[rng.permutation(len(members))]
        train.extend(members[:k])
        test.extend(members[k:k + t])
    return rng.permutation(train), rng.permutation(test)


def _apportion(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """``draws`` shared among classes in proportion to ``counts``: floors, then one more to the largest
    remainders, ties broken at random (scikit-learn's ``_approximate_mode``)."""
    exact = counts / counts.sum() * draws
    shares = np.floor(exact)
    missing = int(draws - shares.sum())
    remainder = exact - shares
    for value in np.sort(np.unique(remainder))[::-1]:
        if missing <= 0:
            break
        (tied,) = np.where(remainder == value)
        chosen = rng.choice(tied, size=min(len(tied), missing), replace=False)
        shares[chosen] += 1
        missing -= len(chosen)
    return shares.astype(int)


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally gzipped): 2 zero bytes, type code, ndim, big-endian uint32 dims, data."""
    path = Path(path)
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    if raw[2] != 0x08:
        raise ValueError(f"{path}: IDX type code 0x{raw[2]:02x} unsupported (only unsigned byte, 0x08)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: IDX header says {dims} = {int(np.prod(dims))} bytes, file holds {data.size}")
    return data.reshape(dims)


def _find_idx(folder: Path) -> list[Path] | None:
    """The four IDX files in ``folder`` (raw preferred over .gz), or None unless all four exist."""
    found = []
    for name in _IDX:
        hit = next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found


def _check_split(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...], where: object) -> None:
    if x.dtype != np.uint8 or x.shape[1:] != shape or y.shape != (x.shape[0],):
        raise ValueError(f"{where}: expected uint8 images (N, {shape}) and N labels, "
                         f"got {x.dtype} {x.shape}, {y.shape}")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{where}: labels outside 0..9")


def _load_mnist_like(key: str, root: Path) -> tuple[ArrayDataset, ArrayDataset]:
    """``<root>/<key>.npz`` first, then the official IDX files in the dataset's folders, then ``root``.

    IDX files directly in ``root`` are taken as whichever dataset was asked for (MNIST and
    Fashion-MNIST use the same file names), so keep the two in separate folders.
    """
    npz = root / f"{key}.npz"
    if npz.is_file():
        with np.load(npz, allow_pickle=False) as d:
            missing = {"x_train", "y_train", "x_test", "y_test"} - set(d.files)
            if missing:
                raise ValueError(f"{npz}: missing arrays {sorted(missing)}")
            arrays = [d[k] for k in ("x_train", "y_train", "x_test", "y_test")]
        where: object = npz
    else:
        folders = [(root / sub).resolve() for sub in _SUBDIRS[key]]
        files = next((f for f in map(_find_idx, folders) if f), None)
        if files is None:
            looked = ", ".join(str(f) for f in folders)
            raise DatasetNotFoundError(
                f"{key}: neither {npz} nor the four IDX files ({', '.join(_IDX)}, raw or .gz) in any of {looked}. "
                f"Put {key}.npz (arrays x_train, y_train, x_test, y_test) or the official IDX files in {root}, "
                f"or point --data-dir / DFL_DATA_DIR at the folder that holds them.")
        arrays = [read_idx(f) for f in files]
        where = files[0].parent
    xtr, ytr, xte, yte = arrays
    _check_split(xtr, ytr, (28, 28), where)
    _check_split(xte, yte, (28, 28), where)
    return _to_dataset(xtr[:, None], ytr, key), _to_dataset(xte[:, None], yte, key)


def _cifar_py(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    with open(folder / name, "rb") as f:
        batch = pickle.load(f, encoding="bytes")  # safe: local official CIFAR-10 file, never network input
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{folder / name}: not a CIFAR-10 batch (needs keys b'data', b'labels')")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{folder / name}: data must be (N, 3072), got {data.shape}")
    return data.reshape(-1, 3, 32, 32), np.asarray(batch[b"labels"], dtype=np.int64)


def _cifar_bin(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(folder / f"{name}.bin", dtype=np.uint8)
    if raw.size % 3073:
        raise ValueError(f"{folder / name}.bin: size {raw.size} is not a multiple of 3073-byte records")
    rec = raw.reshape(-1, 3073)
    return rec[:, 1:].reshape(-1, 3, 32, 32), rec[:, 0].astype(np.int64)


def _load_cifar10(root: Path) -> tuple[ArrayDataset, ArrayDataset]:
    """The official python (pickled dicts) or binary (1 label byte + 3072 pixel bytes) release."""
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    options = ((root / "cifar-10-batches-py", "", _cifar_py), (root / "cifar-10-batches-bin", ".bin", _cifar_bin))
    for folder, ext, reader in options:
        if all((folder / f"{n}{ext}").is_file() for n in names):
            parts = [reader(folder, n) for n in names]
            xtr = np.concatenate([p[0] for p in parts[:5]])
            ytr = np.concatenate([p[1] for p in parts[:5]])
            (xte, yte), where = parts[5], folder
            _check_split(xtr, ytr, (3, 32, 32), where)
            _check_split(xte, yte, (3, 32, 32), where)
            return _to_dataset(xtr, ytr, "cifar10"), _to_dataset(xte, yte, "cifar10")
    raise DatasetNotFoundError(
        f"cifar10: no complete {options[0][0]} (data_batch_1..5, test_batch) or {options[1][0]} "
        f"(data_batch_1..5.bin, test_batch.bin). Download 'CIFAR-10 python version' or 'binary version' "
        f"from https://www.cs.toronto.edu/~kriz/cifar.html on a connected machine, extract it into {root}, "
        f"or point --data-dir / DFL_DATA_DIR at the folder that holds it.")


def save_shard(path: str | Path, data: ArrayDataset, dataset: str | None = None,
               settings: dict[str, int | float] | None = None) -> None:
    """Write a node's data as safetensors (``x``, ``y``; metadata ``num_classes`` and, if given, the name of
    the ``dataset`` it was drawn from, whose learning defaults a node then uses, or the learning ``settings`` of
    its fleet, for a dataset of the user's own): no pickle on the wire."""
    from safetensors.torch import save_file

    metadata = {"num_classes": str(int(data.num_classes)), **({"dataset": dataset} if dataset else {}),
                **{name: str(value) for name, value in (settings or {}).items()}}
    save_file({"x": data.x.contiguous(), "y": data.y.contiguous()}, str(path), metadata=metadata)


def shard_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a shard written by :func:`save_shard` (its header only: no tensor is read); empty for a
    file that is missing, unreadable or not safetensors (:func:`load_shard` reports that one)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception:  # missing, unreadable or corrupt: whoever loads the data says so
        return {}


def shard_dataset(path: str | Path) -> str | None:
    """The dataset a shard written by :func:`save_shard` was drawn from, as its metadata names it; None for a
    shard that names none (written before shards did, or by other tools), one that names no dataset of
    :data:`DATASETS`, and a file that is missing or unreadable."""
    name = shard_metadata(path).get("dataset")
    return name if name in DATASETS else None


def load_shard(path: str | Path) -> ArrayDataset:
    """Read a shard written by ``save_shard``; any malformed content is a ValueError naming the file."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shard file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
            tensors = {k: f.get_tensor(k) for k in keys & {"x", "y"}}
    except Exception as exc:  # safetensors raises its own error types on corrupt headers
        raise ValueError(f"{path}: not a readable safetensors shard ({exc})") from exc
    if keys != {"x", "y"}:
        raise ValueError(f"{path}: shard must hold exactly tensors 'x' and 'y', found {sorted(keys)}")
    try:
        num_classes = int(meta["num_classes"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}: metadata 'num_classes' missing or not an integer") from None
    x, y = tensors["x"], tensors["y"]
    if num_classes < 1:
        raise ValueError(f"{path}: num_classes must be >= 1, got {num_classes}")
    if x.dtype != torch.float32 or x.ndim < 2:
        raise ValueError(f"{path}: 'x' must be float32 (N, *sample shape), got {x.dtype} {tuple(x.shape)}")
    targets = y.dtype == torch.float32 and y.ndim == 2 and y.shape[1] == num_classes  # a regression shard's
    if not (targets or (y.dtype == torch.int64 and y.ndim == 1)) or y.shape[0] != x.shape[0]:
        raise ValueError(f"{path}: 'y' must be int64 (N,) labels or float32 (N, {num_classes}) targets with "
                         f"N={x.shape[0]}, got {y.dtype} {tuple(y.shape)}")
    if targets and y.numel() and not bool(torch.isfinite(y).all()):
        raise ValueError(f"{path}: its targets hold NaN or an infinity")
    if not targets and y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"{path}: labels must lie in [0, {num_classes}), got [{int(y.min())}, {int(y.max())}]")
    return ArrayDataset(x, y, num_classes)
