"""Split a training set among K clients the way the papers do, reproducibly from one seed.

Schemes (``PARTITIONS``):

* ``iid``        -- shuffle, K equal parts (000 §IV.C, 003 IID).
* ``shards``     -- 000 §IV.C ζ-shards: sort by label, K·ζ equal contiguous segments,
                    ζ random segments per client. Smaller ζ = more heterogeneous.
* ``classes``    -- 001 / 002: each client holds ζ random distinct classes.
* ``dirichlet``  -- 003: per class, proportions over clients ~ Dir(β); small β = heavy label skew.
* ``unbalanced`` -- 002: IID content, local sizes drawn from 400..1600 plus two large nodes.
* ``classes-unbalanced`` -- 002's unbalanced non-IID case: ζ random classes per client, sizes
                    as ``unbalanced`` (400..1600, plus ``large_nodes`` clients of 10,000).

002's other scenarios are options of these: ``samples`` gives every ``iid`` or ``classes`` client
exactly that many samples (002's balanced 800, :func:`sized`), ``zeta_max`` lets client k draw its
own ζ_k from ζ..ζ_max (002's "ζ = 2, 3, 4"), ``large_nodes`` sets how many unbalanced clients are
large (002 has them in the non-IID case only).

A recorded fleet is not split at all: the partition setting ``as-recorded``
(:data:`~dfl_node.learning.shard_settings.AS_RECORDED`) takes a folder of one subfolder (or file) per device as
it is, one node each (:func:`~dfl_node.learning.user_datasets.load_recorded`); the schemes here split pooled data.

Every function returns one **sorted** int64 index array per client (indices into the
training set), clients never overlap, and the same seed always gives the same output:
all randomness comes from ``np.random.default_rng(seed)`` (or a generator passed in).
Indices are sorted so a partition is a set; the order of training is the loader's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARTITIONS = ("iid", "shards", "classes", "dirichlet", "unbalanced", "classes-unbalanced")


@dataclass(frozen=True)
class ClientSplit:
    """One client's local data: ``train`` for local updates, ``val`` for its local accuracy."""

    train: np.ndarray  # sorted int64 indices into the training set
    val: np.ndarray  # sorted int64 indices, disjoint from train


def _labels(labels: np.ndarray, num_clients: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {y.dtype} {y.shape}")
    if y.size and y.min() < 0:
        raise ValueError("labels must be non-negative class ids")
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
    if y.size < num_clients:
        raise ValueError(f"cannot split {y.size} samples among {num_clients} clients")
    return y.astype(np.int64, copy=False)


def _out(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and cut into K equal parts; the remainder (< K samples) is dropped so sizes match."""
    y = _labels(labels, num_clients)
    size = y.size // num_clients
    perm = rng.permutation(y.size)[: size * num_clients]
    return _out(list(perm.reshape(num_clients, size)))


def shards(labels: np.ndarray, num_clients: int, zeta: int, rng: np.random.Generator) -> list[np.ndarray]:
    """000 §IV.C: stable-sort by label, K·ζ equal contiguous segments, ζ random segments per client.

    Segment s is ``order[s*L:(s+1)*L]`` with ``order = argsort(labels, stable)`` and
    ``L = N // (K·ζ)``; the last ``N mod K·ζ`` samples of that order (highest label) are
    dropped. A random permutation of the K·ζ segment ids is chunked into K groups of ζ,
    so every segment goes to exactly one client. A segment may straddle a class boundary:
    when no segment is longer than the smallest class, a client holds at most 2ζ classes
    (exactly ζ segments always; ζ classes when every class fills whole segments).
    """
    y = _labels(labels, num_clients)
    if not isinstance(zeta, (int, np.integer)) or zeta < 1:
        raise ValueError(f"zeta must be a positive integer, got {zeta!r}")
    n_seg = num_clients * zeta
    seg_len = y.size // n_seg
    if seg_len == 0:
        raise ValueError(f"{y.size} samples cannot form K*zeta = {n_seg} non-empty segments")
    order = np.argsort(y, kind="stable")[: seg_len * n_seg].reshape(n_seg, seg_len)
    ids = rng.permutation(n_seg).reshape(num_clients, zeta)
    return _out([order[row].ravel() for row in ids])


def _zetas(classes: np.ndarray, num_clients: int, zeta: int, zeta_max: int, rng: np.random.Generator) -> list[int]:
    """Each client's number of classes: ``zeta``, or drawn uniformly from ``zeta..zeta_max`` (when ``zeta_max``)."""
    if not isinstance(zeta, (int, np.integer)) or not 1 <= zeta <= classes.size:
        raise ValueError(f"zeta must be in 1..{classes.size} (classes present), got {zeta!r}")
    if not zeta_max:
        return [int(zeta)] * num_clients
    if not zeta <= zeta_max <= classes.size:
        raise ValueError(f"zeta_max must be in {zeta}..{classes.size} (zeta..classes present), got {zeta_max!r}")
    return [int(z) for z in rng.integers(zeta, zeta_max, size=num_clients, endpoint=True)]


def random_classes(labels: np.ndarray, num_clients: int, zeta: int, rng: np.random.Generator, *,
                   zeta_max: int = 0) -> list[np.ndarray]:
    """001 (and 002's non-IID case): each client gets ζ distinct random classes.

    Each class's samples are shuffled and split as equally as possible (sizes differ by
    at most 1) among the clients that hold it, so no sample is shared. Classes that no
    client drew are dropped; a class held by many clients gives each of them fewer samples.
    The classes are those present in ``labels``. With ``zeta_max``, client k holds ζ_k
    classes, ζ_k drawn uniformly from ``zeta..zeta_max``.
    """
    y = _labels(labels, num_clients)
    classes = np.unique(y)
    zetas = _zetas(classes, num_clients, zeta, zeta_max, rng)
    held = [rng.choice(classes, size=z, replace=False) for z in zetas]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        owners = [k for k in range(num_clients) if c in held[k]]
        if owners:
            pieces = np.array_split(rng.permutation(np.flatnonzero(y == c)), len(owners))
            for k, piece in zip(owners, pieces):
                parts[k].append(piece)
    return _out([np.concatenate(p) for p in parts])


def dirichlet(labels: np.ndarray, num_clients: int, beta: float, rng: np.random.Generator,
              min_size: int = 10, max_tries: int = 1000) -> list[np.ndarray]:
    """003: for each class, split its shuffled samples among clients with proportions ~ Dir(β·1).

    Small β gives heavy label skew (β = 0.1 in 003), large β approaches IID. The whole
    draw is repeated until every client has at least ``min_size`` samples; after
    ``max_tries`` failed draws a ValueError says to lower ``min_size`` or raise β.
    """
    y = _labels(labels, num_clients)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if min_size * num_clients > y.size:
        raise ValueError(f"min_size={min_size} for {num_clients} clients needs more than {y.size} samples")
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, beta))) * idx.size).astype(np.int64)[:-1]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        out = _out([np.concatenate(p) for p in parts])
        if min(p.size for p in out) >= min_size:
            return out
    raise ValueError(f"no Dirichlet(beta={beta}) draw in {max_tries} tries gave every one of {num_clients} "
                     f"clients >= {min_size} samples; lower min_size, raise beta or use fewer clients")


def _unbalanced_sizes(num_clients: int, rng: np.random.Generator, low: int, high: int, num_large: int,
                     large_size: int) -> np.ndarray:
    if not 1 <= low <= high or large_size < 1 or num_large < 0:
        raise ValueError(f"need 1 <= low <= high, large_size >= 1, num_large >= 0; got {low}, {high}, "
                         f"{large_size}, {num_large}")
    sizes = rng.integers(low, high, size=num_clients, endpoint=True)
    large = rng.choice(num_clients, size=min(num_large, num_clients - 1), replace=False)
    sizes[large] = large_size
    return sizes


def unbalanced(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, low: int = 400,
               high: int = 1600, num_large: int = 2, large_size: int = 10_000) -> list[np.ndarray]:
    """002 §5.1 unbalanced sizes with IID content.

    002 draws local dataset sizes in 400..1600 and gives 2 nodes a large dataset (10,000
    samples). Here: ``min(num_large, num_clients - 1)`` randomly chosen clients (at least
    one normal client stays; with K = 1 the single client is normal) get ``large_size``,
    the others an integer size drawn uniformly from ``[low, high]``. Samples are drawn
    without replacement from a random permutation, so content is IID and unused samples
    are left out. If the sizes add up to more than the dataset, **all sizes are scaled
    down by the same factor** (floor, at least 1 each) so the proportions are kept,
    e.g. for ``digits``.
    """
    y = _labels(labels, num_clients)
    sizes = _unbalanced_sizes(num_clients, rng, low, high, num_large, large_size)
    if sizes.sum() > y.size:
        sizes = np.maximum(1, np.floor(sizes * (y.size / sizes.sum()))).astype(np.int64)
        if sizes.sum() > y.size:
            raise ValueError(f"{y.size} samples are too few for {num_clients} unbalanced clients")
    perm = rng.permutation(y.size)
    return _out(np.split(perm[: sizes.sum()], np.cumsum(sizes)[:-1]))


def sized(labels: np.ndarray, sizes: np.ndarray | list[int], rng: np.random.Generator,
          zetas: list[int] | None = None) -> list[np.ndarray]:
    """002's local datasets of given sizes: client k draws ``sizes[k]`` samples, without replacement.

    IID (``zetas`` None): consecutive blocks of one random permutation. Non-IID: client k holds
    ``zetas[k]`` distinct random classes and takes its size from them in (nearly) equal shares.
    A dataset smaller than the sizes asked for cannot give them: in the IID case all sizes are
    scaled down by one factor (as :func:`unbalanced` does); in the non-IID case, where the holders
    of a class ask for more of it than there is (MNIST has ~6,000 per class, 002's E-MNIST 24,000),
    every holder's share of *that* class is scaled down by the same factor (floor).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    y = _labels(labels, sizes.size)
    if sizes.min(initial=1) < 1:
        raise ValueError(f"every client needs at least 1 sample, got sizes {sizes.tolist()}")
    if zetas is None:
        if sizes.sum() > y.size:
            sizes = np.asarray(np.maximum(1, np.floor(sizes * (y.size / sizes.sum()))).astype(np.int64))
        perm = rng.permutation(y.size)
        return _out(np.split(perm[: sizes.sum()], np.cumsum(sizes)[:-1]))
    classes = np.unique(y)
    held = [rng.choice(classes, size=z, replace=False) for z in zetas]
    shares = [dict(zip(h, (len(a) for a in np.array_split(np.empty(n), len(h))))) for h, n in zip(held, sizes)]
    parts: list[list[np.ndarray]] = [[] for _ in range(sizes.size)]
    for c in classes:
        owners = [k for k in range(sizes.size) if c in shares[k]]
        if not owners:
            continue
        pool = rng.permutation(np.flatnonzero(y == c))
        wanted = np.array([shares[k][c] for k in owners], dtype=np.int64)
        if wanted.sum() > pool.size:
            wanted = np.floor(wanted * (pool.size / wanted.sum())).astype(np.int64)
        for k, piece in zip(owners, np.split(pool[: wanted.sum()], np.cumsum(wanted)[:-1])):
            parts[k].append(piece)
    return _out([np.concatenate(p) if p else np.empty(0, np.int64) for p in parts])


def partition(labels: np.ndarray, num_clients: int, scheme: str, seed: int, *,
              zeta: int = 2, beta: float = 0.5, zeta_max: int = 0, samples: int = 0,
              large_nodes: int = 2) -> list[np.ndarray]:
    """Partition ``labels`` among ``num_clients`` with ``scheme`` using ``np.random.default_rng(seed)``.

    ``zeta`` is used by ``shards`` and the ``classes`` schemes, ``beta`` by ``dirichlet``;
    ``zeta_max`` and ``samples`` by ``classes`` (``samples`` by ``iid`` too), ``large_nodes`` by
    the unbalanced schemes (see the module docstring).
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return sized(labels, [samples] * num_clients, rng) if samples else iid(labels, num_clients, rng)
    if scheme == "shards":
        return shards(labels, num_clients, zeta, rng)
    if scheme == "classes":
        if not samples:
            return random_classes(labels, num_clients, zeta, rng, zeta_max=zeta_max)
        zetas = _zetas(np.unique(_labels(labels, num_clients)), num_clients, zeta, zeta_max, rng)
        return sized(labels, [samples] * num_clients, rng, zetas)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, beta, rng)
    if scheme == "unbalanced":
        return unbalanced(labels, num_clients, rng, num_large=large_nodes)
    if scheme == "classes-unbalanced":
        sizes = _unbalanced_sizes(num_clients, rng, 400, 1600, large_nodes, 10_000)
        zetas = _zetas(np.unique(_labels(labels, num_clients)), num_clients, zeta, zeta_max, rng)
        return sized(labels, sizes, rng, zetas)
    raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(PARTITIONS)}")


def train_val_split(indices: np.ndarray, val_fraction: float, rng: np.random.Generator) -> ClientSplit:
    """Shuffle a client's indices; the first ``len - round(len·val_fraction)`` train, the rest validate.

    003 uses 80:20 (callers pass ``val_fraction=0.2``). Both parts are returned sorted.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    idx = rng.permutation(np.asarray(indices, dtype=np.int64))
    n_train = idx.size - int(round(idx.size * val_fraction))
    return ClientSplit(train=np.sort(idx[:n_train]), val=np.sort(idx[n_train:]))


def client_splits(labels: np.ndarray, num_clients: int, scheme: str, seed: int, *, zeta: int = 2,
                  beta: float = 0.5, val_fraction: float = 0.2, **options: int) -> list[ClientSplit]:
    """``partition(...)`` then a train/val split per client, reproducible from ``seed`` alone.

    The partition uses ``default_rng(seed)`` (so ``train ∪ val`` equals ``partition(...)[k]``);
    client k's split uses ``default_rng(SeedSequence(seed).spawn(K)[k])``, an independent
    stream, so a node can compute its own split without the others'. ``options``: ``zeta_max``,
    ``samples``, ``large_nodes`` of :func:`partition`. A client left without a sample to train on, or (with
    ``val_fraction`` above 0) without one to validate on, is a ``ValueError``: the operator's numbers, which
    :func:`~dfl_node.learning.provision.provision` says in a line.
    """
    parts = partition(labels, num_clients, scheme, seed, zeta=zeta, beta=beta, **options)
    streams = np.random.SeedSequence(int(seed)).spawn(num_clients)
    splits = [train_val_split(p, val_fraction, np.random.default_rng(s)) for p, s in zip(parts, streams)]
    small = next((s for s in splits if not len(s.train) or (val_fraction and not len(s.val))), None)
    if small is not None:  # a node that cannot train, or whose local accuracy would be undefined
        raise ValueError(f"a node would get {len(small.train) + len(small.val)} of them, too few to train on and "
                         f"hold {val_fraction:g} back for local validation")
    return splits
