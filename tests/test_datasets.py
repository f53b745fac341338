"""Dataset loading (real MNIST / Fashion-MNIST, IDX and CIFAR-10 layouts written here) and shard files."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from dfl_node.learning.datasets import (
    DATASETS,
    DIGITS_FILE,
    ArrayDataset,
    DatasetNotFoundError,
    load_dataset,
    load_shard,
    read_idx,
    resolve_data_dir,
    save_shard,
    stratified_split,
)

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def _data_dir() -> Path:
    env = os.environ.get("DFL_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


def _real(name: str) -> tuple[ArrayDataset, ArrayDataset]:
    if not (_data_dir() / f"{name}.npz").is_file():
        pytest.fail(f"real {name} not found in {_data_dir()}: clone next to shared/ or set DFL_DATA_DIR")
    return load_dataset(name, _data_dir())


@pytest.fixture(scope="module")
def mnist() -> tuple[ArrayDataset, ArrayDataset]:
    return _real("mnist")


@pytest.fixture(scope="module")
def fmnist() -> tuple[ArrayDataset, ArrayDataset]:
    return _real("fashion_mnist")


@pytest.fixture(scope="module")
def mnist_npz() -> dict[str, np.ndarray]:
    if not (_data_dir() / "mnist.npz").is_file():
        pytest.fail("real MNIST not found: clone next to shared/ or set DFL_DATA_DIR")
    with np.load(_data_dir() / "mnist.npz", allow_pickle=False) as d:
        return {k: d[k][:300] for k in d.files}


def _write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> Path:
    """An IDX file written by hand: 0, 0, type 0x08, ndim, big-endian uint32 dims, raw bytes."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    blob = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)
    return path


def _write_idx_set(folder: Path, xtr, ytr, xte, yte, gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in zip(IDX_NAMES, (xtr, ytr, xte, yte)):
        _write_idx(folder / name, arr, gz)


# ---------------------------------------------------------------- digits


def test_digits() -> None:
    train, test = load_dataset("digits")
    assert (len(train), len(test)) == (1437, 360)
    assert train.input_shape == (1, 8, 8) and train.x.shape == (1437, 1, 8, 8)
    assert train.num_classes == test.num_classes == 10
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert float(train.x.min()) == 0.0 and float(train.x.max()) == 1.0
    total = train.class_counts() + test.class_counts()
    assert total.tolist() == DIGITS_COUNTS
    assert np.all(np.abs(test.class_counts() - total * 0.2) <= 1)  # stratified
    train2, _ = load_dataset("digits")  # fixed split, same on every node
    assert torch.equal(train.x, train2.x) and torch.equal(train.y, train2.y)


# The embedded digits file (scikit-learn's load_digits as uint8, written once from it) and the indices of its
# 80/20 split (those of sklearn's train_test_split(stratify=..., random_state=0)): pinned, so that a change to
# either shows here whether or not scikit-learn is installed.
DIGITS_SHA256 = "b2dab7b501728c22e9119ad76740b2e17c77a231e42d1e592380d90886f1a05e"
DIGITS_SPLIT_SHA256 = "c2c37eddf53c5760fcdd74abac61600a5d88406ff48a08fa172800c1236593b6"
DIGITS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def _split_digest(train: np.ndarray, test: np.ndarray) -> str:
    return hashlib.sha256(train.astype("<i8").tobytes() + test.astype("<i8").tobytes()).hexdigest()


def test_digits_file() -> None:
    assert hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest() == DIGITS_SHA256
    with np.load(DIGITS_FILE, allow_pickle=False) as arrays:
        images, labels = arrays["images"], arrays["labels"]
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert images.dtype == labels.dtype == np.uint8 and int(images.max()) == 16
    assert np.bincount(labels).tolist() == DIGITS_COUNTS
    assert _split_digest(*stratified_split(labels, 0.2, 0)) == DIGITS_SPLIT_SHA256
    if importlib.util.find_spec("sklearn") is None:  # not a dependency: where it is installed, check against it
        return
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    assert np.array_equal(images, digits.images) and np.array_equal(labels, digits.target)
    train, test = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0)
    assert _split_digest(train, test) == DIGITS_SPLIT_SHA256


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_stratified_split(seed: int) -> None:
    labels = np.repeat(np.arange(4), [10, 7, 5, 3])
    train, test = stratified_split(labels, 0.3, seed)
    assert len(test) == 8 and len(train) == 17  # ceil(0.3 * 25) tested
    assert sorted([*train, *test]) == list(range(25))  # a partition of the indices
    assert np.all(np.abs(np.bincount(labels[test], minlength=4) - np.bincount(labels) * 8 / 25) <= 1)
    assert all(np.array_equal(a, b) for a, b in zip((train, test), stratified_split(labels, 0.3, seed)))
    with pytest.raises(ValueError, match="too few"):
        stratified_split(np.array([0, 0, 0, 1]), 0.5, seed)


# ---------------------------------------------------------------- real MNIST / Fashion-MNIST


def test_real_mnist(mnist) -> None:
    train, test = mnist
    assert (len(train), len(test)) == (60000, 10000)
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.class_counts().tolist() == MNIST_TRAIN_COUNTS
    assert test.class_counts().tolist() == MNIST_TEST_COUNTS
    assert abs(float(train.x.mean())) < 1e-3 and abs(float(train.x.std()) - 1) < 1e-3  # 0.1307 / 0.3081
    assert float(train.x.min()) == pytest.approx(-0.1307 / 0.3081, abs=1e-6)


def test_real_fashion_mnist(fmnist) -> None:
    train, test = fmnist
    assert (len(train), len(test)) == (60000, 10000)
    assert train.input_shape == (1, 28, 28)
    assert train.class_counts().tolist() == [6000] * 10 and test.class_counts().tolist() == [1000] * 10
    assert abs(float(train.x.mean())) < 1e-3 and abs(float(train.x.std()) - 1) < 1e-3  # 0.2860 / 0.3530


def test_idx_from_real_arrays_matches_npz(tmp_path: Path, mnist, mnist_npz) -> None:
    d = mnist_npz
    _write_idx_set(tmp_path / "mnist", d["x_train"], d["y_train"], d["x_test"][:50], d["y_test"][:50], gz=True)
    train, test = load_dataset("mnist", tmp_path)
    assert torch.equal(train.x, mnist[0].x[:300]) and torch.equal(train.y, mnist[0].y[:300])
    assert torch.equal(test.x, mnist[1].x[:50]) and torch.equal(test.y, mnist[1].y[:50])


# ---------------------------------------------------------------- IDX files written here


def _tiny_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_mnist_top_level(tmp_path: Path, gz: bool) -> None:
    xtr, ytr = _tiny_images(12, 0)
    xte, yte = _tiny_images(5, 1)
    _write_idx_set(tmp_path, xtr, ytr, xte, yte, gz=gz)
    train, test = load_dataset("mnist", tmp_path)
    assert train.x.shape == (12, 1, 28, 28) and test.x.shape == (5, 1, 28, 28)
    assert train.y.tolist() == ytr.tolist() and test.y.tolist() == yte.tolist()
    expected = (xtr.astype(np.float32) / 255 - 0.1307) / 0.3081
    assert np.allclose(train.x[:, 0].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("sub", ["fashion_mnist", "fashion-mnist"])
def test_idx_fashion_subfolder_uses_fmnist_stats(tmp_path: Path, sub: str) -> None:
    xtr, ytr = _tiny_images(8, 2)
    xte, yte = _tiny_images(4, 3)
    _write_idx_set(tmp_path / sub, xtr, ytr, xte, yte, gz=True)
    train, _ = load_dataset("fashion_mnist", tmp_path)
    expected = (xtr.astype(np.float32) / 255 - 0.2860) / 0.3530
    assert np.allclose(train.x[:, 0].numpy(), expected, atol=1e-6)
    with pytest.raises(DatasetNotFoundError):  # Fashion-MNIST's folder is not MNIST's
        load_dataset("mnist", tmp_path)


def test_read_idx_validates(tmp_path: Path) -> None:
    good = _write_idx(tmp_path / "a", np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    assert np.array_equal(read_idx(good), np.arange(24).reshape(2, 3, 4))
    raw = good.read_bytes()
    (tmp_path / "magic").write_bytes(b"\x01" + raw[1:])
    (tmp_path / "type").write_bytes(raw[:2] + b"\x0d" + raw[3:])  # float type code
    (tmp_path / "short").write_bytes(raw[:-1])
    (tmp_path / "long").write_bytes(raw + b"\x00")
    for name, match in [("magic", "magic"), ("type", "type code"), ("short", "header says"), ("long", "header says")]:
        with pytest.raises(ValueError, match=match):
            read_idx(tmp_path / name)


def test_idx_label_count_mismatch(tmp_path: Path) -> None:
    xtr, ytr = _tiny_images(6, 0)
    _write_idx_set(tmp_path, xtr, ytr[:5], xtr, ytr)
    with pytest.raises(ValueError, match="labels"):
        load_dataset("mnist", tmp_path)


# ---------------------------------------------------------------- CIFAR-10 in both official layouts


def _cifar_batches(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return {n: (rng.integers(0, 256, (3, 3072), dtype=np.uint8), rng.integers(0, 10, 3)) for n in names}


def _write_cifar_py(root: Path, batches) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, (data, labels) in batches.items():
        d = {b"batch_label": name.encode(), b"labels": [int(v) for v in labels], b"data": data,
             b"filenames": [b"x.png"] * len(labels)}
        (folder / name).write_bytes(pickle.dumps(d, protocol=2))


def _write_cifar_bin(root: Path, batches) -> None:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name, (data, labels) in batches.items():
        rec = np.concatenate([labels.astype(np.uint8)[:, None], data], axis=1)
        (folder / f"{name}.bin").write_bytes(rec.tobytes())


@pytest.mark.parametrize("writer", [_write_cifar_py, _write_cifar_bin])
def test_cifar10_layouts(tmp_path: Path, writer) -> None:
    batches = _cifar_batches(0)
    writer(tmp_path, batches)
    train, test = load_dataset("cifar10", tmp_path)
    assert train.x.shape == (15, 3, 32, 32) and test.x.shape == (3, 3, 32, 32) and train.num_classes == 10
    assert train.y.tolist() == np.concatenate([batches[f"data_batch_{i}"][1] for i in range(1, 6)]).tolist()
    data = batches["data_batch_2"][0]  # rows are R(1024) G(1024) B(1024), each 32x32 row-major
    for c, h, w in [(0, 0, 0), (1, 5, 7), (2, 31, 30)]:
        expected = (data[1, c * 1024 + h * 32 + w] / 255 - CIFAR_MEAN[c]) / CIFAR_STD[c]
        assert float(train.x[4, c, h, w]) == pytest.approx(expected, abs=1e-5)


def test_cifar10_py_and_bin_agree(tmp_path: Path) -> None:
    batches = _cifar_batches(1)
    _write_cifar_py(tmp_path / "a", batches)
    _write_cifar_bin(tmp_path / "b", batches)
    (pa, ta), (pb, tb) = load_dataset("cifar10", tmp_path / "a"), load_dataset("cifar10", tmp_path / "b")
    assert torch.equal(pa.x, pb.x) and torch.equal(pa.y, pb.y) and torch.equal(ta.x, tb.x)


def test_cifar10_bin_bad_size(tmp_path: Path) -> None:
    _write_cifar_bin(tmp_path, _cifar_batches(2))
    path = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="3073"):
        load_dataset("cifar10", tmp_path)


# ---------------------------------------------------------------- missing data and names


def test_missing_mnist_names_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("mnist", tmp_path)
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    assert str(tmp_path / "mnist.npz") in msg and "train-images-idx3-ubyte" in msg and "DFL_DATA_DIR" in msg


def test_missing_cifar_names_folders(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-batches-py").mkdir()  # incomplete folder still counts as missing
    with pytest.raises(DatasetNotFoundError, match="cifar-10-batches-py") as err:
        load_dataset("cifar10", tmp_path)
    assert "cifar-10-batches-bin" in str(err.value)


def test_no_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DFL_DATA_DIR", raising=False)
    assert resolve_data_dir(None) is None
    with pytest.raises(DatasetNotFoundError, match="DFL_DATA_DIR"):
        load_dataset("fashion_mnist")
    monkeypatch.setenv("DFL_DATA_DIR", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir(tmp_path / "x") == tmp_path / "x"  # explicit wins over the env


def test_unknown_dataset() -> None:
    assert "cifar10" in DATASETS
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet")


# ---------------------------------------------------------------- shards on disk


@pytest.fixture()
def small() -> ArrayDataset:
    g = torch.Generator().manual_seed(0)
    return ArrayDataset(torch.randn(20, 1, 8, 8, generator=g), torch.randint(0, 10, (20,), generator=g), 10)


def test_subset_and_counts(small: ArrayDataset) -> None:
    sub = small.subset(np.array([3, 1, 3]))
    assert torch.equal(sub.x, small.x[[3, 1, 3]]) and sub.y.tolist() == small.y[[3, 1, 3]].tolist()
    assert torch.equal(small.subset(torch.tensor([2])).x, small.x[2:3])
    assert small.class_counts().sum() == 20 and small.class_counts().size == 10
    assert small.input_shape == (1, 8, 8) and len(small) == 20


def test_shard_round_trip(tmp_path: Path, small: ArrayDataset) -> None:
    save_shard(tmp_path / "s.safetensors", small)
    back = load_shard(tmp_path / "s.safetensors")
    assert torch.equal(back.x, small.x) and torch.equal(back.y, small.y) and back.num_classes == 10


@pytest.mark.parametrize(
    "tensors, meta, match",
    [
        ({"x": torch.zeros(2, 1, 8, 8, dtype=torch.float64), "y": torch.zeros(2, dtype=torch.int64)}, "10", "float32"),
        ({"x": torch.zeros(2), "y": torch.zeros(2, dtype=torch.int64)}, "10", "float32"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.zeros(2, dtype=torch.int32)}, "10", "int64"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.zeros(3, dtype=torch.int64)}, "10", "int64"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.tensor([0, 10])}, "10", r"\[0, 10\)"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.tensor([-1, 0])}, "10", r"\[0, 10\)"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.tensor([0, 1])}, None, "num_classes"),
        ({"x": torch.zeros(2, 1, 8, 8), "y": torch.tensor([0, 1]), "z": torch.zeros(1)}, "10", "exactly"),
    ],
)
def test_bad_shard_rejected(tmp_path: Path, tensors, meta, match) -> None:
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata=None if meta is None else {"num_classes": meta})
    with pytest.raises(ValueError, match=match):
        load_shard(path)


def test_garbage_shard_rejected(tmp_path: Path) -> None:
    (tmp_path / "g.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="safetensors"):
        load_shard(tmp_path / "g.safetensors")


def test_samples_of_any_shape_train_an_mlp_and_a_cnn_says_what_it_needs() -> None:
    """A feature vector (F,) and a sensor window (C, L) are datasets as an image is; mlp takes any sample shape,
    the convolutional models say in one line that they need images."""
    from dfl_node.learning.models import ModelSpec

    for shape in ((6,), (3, 20)):
        data = ArrayDataset(torch.randn(5, *shape), torch.tensor([0, 1, 2, 1, 0]), 3)
        assert data.input_shape == shape
        assert ModelSpec.parse("mlp:8").build(data.input_shape, 3)(data.x).shape == (5, 3)
        for name in ("cnn", "cnn-ln"):
            with pytest.raises(ValueError, match=rf"{name} takes image samples \(C, H, W\); these samples are"):
                ModelSpec.parse(name).build(data.input_shape, 3)
