"""Partitions: the papers' schemes, exact structural properties, and reproducibility from the seed."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dfl_node.learning.partitions import (
    PARTITIONS,
    ClientSplit,
    client_splits,
    dirichlet,
    iid,
    partition,
    random_classes,
    shards,
    train_val_split,
    unbalanced,
)


def _data_dir() -> Path:
    env = os.environ.get("DFL_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="module")
def mnist_labels() -> np.ndarray:
    path = _data_dir() / "mnist.npz"
    if not path.is_file():
        pytest.fail(f"real MNIST not found at {path}: clone next to shared/ or set DFL_DATA_DIR")
    with np.load(path, allow_pickle=False) as d:
        return d["y_train"].astype(np.int64)


def _synthetic(n_per_class: int = 240, num_classes: int = 10, seed: int = 123) -> np.ndarray:
    """Shuffled labels, so sorting by label really matters."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), n_per_class))


def _segment_ids(labels: np.ndarray, num_clients: int, zeta: int) -> tuple[np.ndarray, int]:
    """Segment id of every sample under 000's construction (-1 = dropped remainder)."""
    n_seg = num_clients * zeta
    seg_len = labels.size // n_seg
    order = np.argsort(labels, kind="stable")
    seg = np.full(labels.size, -1)
    seg[order[: seg_len * n_seg]] = np.arange(seg_len * n_seg) // seg_len
    return seg, seg_len


def _assert_disjoint(parts: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size, "clients overlap"
    assert allidx.size == 0 or (allidx.min() >= 0 and allidx.max() < n)


def _entropy(labels: np.ndarray, num_classes: int = 10) -> float:
    p = np.bincount(labels, minlength=num_classes) / labels.size
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


# ---------------------------------------------------------------- ζ-shards (000 §IV.C)


@pytest.mark.parametrize("zeta", [1, 2, 4])
def test_shards_exact_segments_and_union(zeta: int) -> None:
    y = _synthetic(n_per_class=240)  # 2400 samples, divisible by K*zeta for K=10
    k = 10
    parts = shards(y, k, zeta, np.random.default_rng(5))
    seg, seg_len = _segment_ids(y, k, zeta)
    seen = []
    for p in parts:
        ids, counts = np.unique(seg[p], return_counts=True)
        assert ids.size == zeta and (ids >= 0).all()
        assert (counts == seg_len).all(), "a client must own whole segments"
        seen.extend(ids.tolist())
    assert sorted(seen) == list(range(k * zeta)), "each segment goes to exactly one client"
    _assert_disjoint(parts, y.size)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))


def test_shards_pure_segments_give_zeta_classes() -> None:
    # 10 classes x 120 samples, K=10, zeta=2 -> 20 segments of 60 that never straddle a class.
    y = _synthetic(n_per_class=120)
    for p in shards(y, 10, 2, np.random.default_rng(0)):
        assert np.unique(y[p]).size <= 2


def test_shards_remainder_dropped_from_sorted_tail() -> None:
    y = _synthetic(n_per_class=243)  # 2430 samples, K*zeta = 40 segments of 60: remainder 30
    parts = shards(y, 10, 4, np.random.default_rng(1))
    used = np.sort(np.concatenate(parts))
    assert used.size == (y.size // 40) * 40
    dropped = np.setdiff1d(np.arange(y.size), used)
    assert np.array_equal(np.sort(dropped), np.sort(np.argsort(y, kind="stable")[used.size:]))


def test_shards_on_real_mnist(mnist_labels: np.ndarray) -> None:
    y, k, zeta = mnist_labels, 10, 4
    parts = partition(y, k, "shards", seed=0, zeta=zeta)
    seg, seg_len = _segment_ids(y, k, zeta)
    assert seg_len == 1500 and (seg >= 0).all()  # 60000 / 40
    seg_labels = [set(np.unique(y[seg == s]).tolist()) for s in range(k * zeta)]
    assert all(len(s) <= 2 for s in seg_labels)  # no MNIST class is shorter than a segment
    for p in parts:
        ids = np.unique(seg[p])
        assert ids.size == zeta and p.size == zeta * seg_len
        assert set(np.unique(y[p]).tolist()) == set().union(*(seg_labels[s] for s in ids))
        assert np.unique(y[p]).size <= 2 * zeta
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))


# ---------------------------------------------------------------- every scheme


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_reproducible_disjoint_sorted(scheme: str) -> None:
    y = _synthetic(n_per_class=2000)  # 20000 samples: enough for unbalanced without scaling
    a = partition(y, 10, scheme, seed=7, zeta=3, beta=0.5)
    b = partition(y, 10, scheme, seed=7, zeta=3, beta=0.5)
    c = partition(y, 10, scheme, seed=8, zeta=3, beta=0.5)
    assert len(a) == 10
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert any(not np.array_equal(p, q) for p, q in zip(a, c))
    for p in a:
        assert p.dtype == np.int64 and p.size > 0 and np.all(np.diff(p) > 0)
    _assert_disjoint(a, y.size)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_client_splits_80_20(scheme: str) -> None:
    y = _synthetic(n_per_class=2000)
    parts = partition(y, 10, scheme, seed=3, zeta=2)
    splits = client_splits(y, 10, scheme, seed=3, zeta=2, val_fraction=0.2)
    again = client_splits(y, 10, scheme, seed=3, zeta=2, val_fraction=0.2)
    other = client_splits(y, 10, scheme, seed=4, zeta=2, val_fraction=0.2)
    for part, s, s2 in zip(parts, splits, again):
        assert isinstance(s, ClientSplit)
        assert np.intersect1d(s.train, s.val).size == 0
        assert np.array_equal(np.sort(np.concatenate([s.train, s.val])), part)
        assert abs(s.val.size - 0.2 * part.size) <= 1 and abs(s.train.size - 0.8 * part.size) <= 1
        assert np.array_equal(s.train, s2.train) and np.array_equal(s.val, s2.val)
    assert any(not np.array_equal(s.val, o.val) for s, o in zip(splits, other))


def test_train_val_split_shuffles() -> None:
    idx = np.arange(100, 200)
    s = train_val_split(idx, 0.2, np.random.default_rng(0))
    assert s.train.size == 80 and s.val.size == 20
    assert not np.array_equal(s.val, np.arange(180, 200)), "val must be a random 20%, not the tail"
    assert train_val_split(idx, 0.0, np.random.default_rng(0)).val.size == 0
    with pytest.raises(ValueError):
        train_val_split(idx, 1.0, np.random.default_rng(0))


def test_iid_equal_parts() -> None:
    y = _synthetic(n_per_class=101)  # 1010 -> 101 each for K=10; with K=7 remainder 2 dropped
    parts = iid(y, 7, np.random.default_rng(0))
    assert [p.size for p in parts] == [1010 // 7] * 7
    _assert_disjoint(parts, y.size)


# ---------------------------------------------------------------- Dirichlet (003)


def test_dirichlet_skew_and_min_size() -> None:
    y = _synthetic(n_per_class=600)
    ent = {}
    for beta in (0.1, 10.0):
        vals = []
        for seed in range(3):
            parts = dirichlet(y, 10, beta, np.random.default_rng(seed), min_size=20)
            assert min(p.size for p in parts) >= 20
            _assert_disjoint(parts, y.size)
            assert sum(p.size for p in parts) == y.size  # Dirichlet uses every sample
            vals.extend(_entropy(y[p]) for p in parts)
        ent[beta] = np.mean(vals)
    assert ent[0.1] < ent[10.0] - 0.5, ent


def test_dirichlet_impossible_min_size() -> None:
    y = _synthetic(n_per_class=30)
    with pytest.raises(ValueError, match="min_size"):
        dirichlet(y, 10, 0.5, np.random.default_rng(0), min_size=31)
    with pytest.raises(ValueError, match="tries"):
        dirichlet(y, 10, 0.01, np.random.default_rng(0), min_size=29, max_tries=5)


# ---------------------------------------------------------------- random classes (001)


def test_random_classes_exact_zeta_and_equal_split() -> None:
    y = _synthetic(n_per_class=500)
    for zeta in (1, 3):
        parts = random_classes(y, 10, zeta, np.random.default_rng(zeta))
        _assert_disjoint(parts, y.size)
        owners: dict[int, list[int]] = {}
        for p in parts:
            held = np.unique(y[p])
            assert held.size == zeta  # labels of a client are exactly its zeta classes
            for c in held:
                owners.setdefault(int(c), []).append(int((y[p] == c).sum()))
        for c in range(10):
            sizes = owners.get(c, [])
            assert sum(sizes) in (0, 500), "a class is either fully shared out or dropped"
            assert not sizes or max(sizes) - min(sizes) <= 1, "equal split among holders"


def test_random_classes_bad_zeta() -> None:
    with pytest.raises(ValueError, match="zeta"):
        random_classes(_synthetic(), 10, 11, np.random.default_rng(0))


# ---------------------------------------------------------------- unbalanced (002)


def test_unbalanced_sizes_like_paper() -> None:
    y = _synthetic(n_per_class=6000)  # 60000
    parts = unbalanced(y, 20, np.random.default_rng(0))
    sizes = np.array([p.size for p in parts])
    assert (sizes == 10_000).sum() == 2
    others = sizes[sizes != 10_000]
    assert others.size == 18 and others.min() >= 400 and others.max() <= 1600
    assert others.std() > 100  # actually unbalanced, not a constant size
    _assert_disjoint(parts, y.size)
    big = parts[int(np.argmax(sizes))]
    assert np.unique(y[big]).size == 10  # IID content


def test_unbalanced_scales_down_proportionally() -> None:
    big = _synthetic(n_per_class=6000)
    small = _synthetic(n_per_class=143)  # 1430 samples, like digits' train split
    raw = np.array([p.size for p in unbalanced(big, 10, np.random.default_rng(9))])
    scaled = np.array([p.size for p in unbalanced(small, 10, np.random.default_rng(9))])
    assert raw.sum() > small.size  # otherwise there is nothing to scale
    expected = np.maximum(1, np.floor(raw * small.size / raw.sum()))
    assert np.array_equal(scaled, expected)
    assert scaled.sum() <= small.size


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scheme="nope"), "unknown partition scheme"),
        (dict(scheme="shards", zeta=0), "zeta"),
        (dict(scheme="dirichlet", beta=0.0), "beta"),
        (dict(scheme="iid", num_clients=0), "num_clients"),
        (dict(scheme="iid", seed=-1), "seed"),
        (dict(scheme="iid", num_clients=5000), "cannot split"),
    ],
)
def test_partition_rejects_bad_args(kwargs: dict, match: str) -> None:
    args = dict(labels=_synthetic(n_per_class=100), num_clients=10, scheme="iid", seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        partition(**args)


def test_partition_rejects_float_labels() -> None:
    with pytest.raises(ValueError, match="integer"):
        partition(np.zeros(100), 2, "iid", 0)


# ---------------------------------------------------------------- 002's scenarios


def _by_class(per_class: int = 6000) -> np.ndarray:
    return np.repeat(np.arange(10), per_class)


def test_balanced_scenarios_give_every_node_800_samples() -> None:
    y = _by_class()
    iid = partition(y, 20, "iid", 0, samples=800)
    skewed = partition(y, 20, "classes", 0, samples=800, zeta=2, zeta_max=4)
    for parts in (iid, skewed):
        assert [p.size for p in parts] == [800] * 20
        assert np.unique(np.concatenate(parts)).size == 16000  # disjoint
    held = [np.unique(y[p]).size for p in skewed]
    assert set(held) <= {2, 3, 4} and len(set(held)) > 1  # ζ_k drawn from 2..4 per node
    assert all(np.unique(y[p]).size == 10 for p in iid)
    assert [p.tolist() for p in skewed] == [p.tolist() for p in partition(y, 20, "classes", 0, samples=800, zeta=2,
                                                                          zeta_max=4)]


def test_unbalanced_scenarios_sizes_and_large_nodes() -> None:
    y = _by_class()
    iid = [p.size for p in partition(y, 20, "unbalanced", 0, large_nodes=0)]
    assert all(400 <= n <= 1600 for n in iid) and np.std(iid) > 100
    skewed = partition(y, 20, "classes-unbalanced", 0, zeta=2, zeta_max=4, large_nodes=2)
    sizes = sorted(p.size for p in skewed)
    assert all(400 <= n <= 1600 for n in sizes[:-2]) and sizes[-2] >= 9000  # two of (nearly) 10,000
    assert all(2 <= np.unique(y[p]).size <= 4 for p in skewed)
    assert np.unique(np.concatenate(skewed)).size == sum(sizes)
    few = _by_class(per_class=1000)  # the large nodes ask more of a class than there is: shares scaled down
    scaled = partition(few, 20, "classes-unbalanced", 0, zeta=2, zeta_max=4, large_nodes=2)
    assert np.unique(np.concatenate(scaled)).size == sum(p.size for p in scaled) <= few.size


def test_unchanged_defaults_keep_the_old_partitions() -> None:
    y = _by_class(200)
    assert [p.tolist() for p in partition(y, 5, "classes", 3, zeta=2)] == \
        [p.tolist() for p in partition(y, 5, "classes", 3, zeta=2, zeta_max=0, samples=0)]
    with pytest.raises(ValueError, match="zeta_max"):
        partition(y, 5, "classes", 3, zeta=3, zeta_max=2)
