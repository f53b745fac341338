"""Provisioning a fleet: an experiment's data settings (:class:`~dfl_node.learning.shard_settings.ShardSettings`)
→ each client's private train/validation data (:class:`FleetData`), and the shard files nodes read.

The simulator and the testbed (which writes the shards that real daemons read) both call
:func:`provision`, so a node of a testbed holds exactly the data of the simulator's client of the
same id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from dfl_node.errors import InputError
from dfl_node.learning.algorithm_settings import DATASET_DEPENDENT, SharedSettings, dataset_defaults, sized_defaults
from dfl_node.learning.dataset_refs import BUILTIN_DATASETS
from dfl_node.learning.datasets import ArrayDataset, save_shard, shard_dataset, shard_metadata
from dfl_node.learning.local_data import Reads
from dfl_node.learning.models import ModelSpec, spread
from dfl_node.learning.partitions import client_splits
from dfl_node.learning.shard_settings import AS_RECORDED, ShardSettings
from dfl_node.learning.tasks import task_of
from dfl_node.learning.user_datasets import load_any_dataset, load_recorded

TRAIN_FILE, VAL_FILE, TEST_FILE = "train.safetensors", "val.safetensors", "test.safetensors"


def fleet_ids(count: int) -> list[str]:
    """Node ids of a provisioned fleet, zero-padded so that they sort by index."""
    width = len(str(count - 1))
    return [f"node-{i:0{width}d}" for i in range(count)]


@dataclass(frozen=True)
class ClientData:
    node_id: str
    train: ArrayDataset
    val: ArrayDataset


@dataclass(frozen=True)
class FleetData:
    """Every client's data, and the global test set."""

    clients: list[ClientData]
    test: ArrayDataset
    dataset: str | None = None  # the name of DATASETS the data was drawn from, written into every shard
    # a dataset of the user's own: the fleet's batch sizes and learning rate, written into every shard
    learning: dict[str, int | float] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.test.input_shape

    @property
    def num_classes(self) -> int:
        return self.test.num_classes


def architectures(specs: list[str], learning: SharedSettings, nodes: int) -> dict[str, ModelSpec]:
    """Each of ``nodes`` nodes' architecture: ``specs`` spread evenly over the fleet (003), else the
    ``model``/``hidden`` of ``learning`` on every node. The testbed gives each daemon its own; the simulator builds
    them."""
    specs = specs or [str(ModelSpec(learning.model, tuple(learning.hidden) if learning.hidden else None))]
    return {node_id: ModelSpec.parse(spec) for node_id, spec in spread(specs, fleet_ids(nodes)).items()}


def subsets(data: ShardSettings, seed: int, train: ArrayDataset,
            test: ArrayDataset) -> tuple[ArrayDataset, ArrayDataset]:
    """The seeded random ``train_samples`` / ``test_samples`` of the dataset that a CPU-sized run uses (0: all)."""
    return _take(train, data.train_samples, seed, 1), _take(test, data.test_samples, seed, 2)


def _take(samples: ArrayDataset, count: int, seed: int, stream: int) -> ArrayDataset:
    """A seeded random subset of ``count`` of ``samples`` (0: all of them)."""
    if not count or count >= len(samples):
        return samples
    rng = np.random.default_rng([seed, stream])  # not the partition's stream: that stays as it was
    return samples.subset(np.sort(rng.choice(len(samples), size=count, replace=False)))


class FleetPlan(Protocol):
    """What provisioning reads of an experiment (:class:`~dfl_node.settings.experiment.ExperimentConfig`): its data,
    how its nodes learn, and how many there are."""

    shards: ShardSettings
    learning: SharedSettings
    nodes: int


def provision(plan: FleetPlan) -> FleetData:
    """Load the dataset and split it into ``plan.nodes`` clients as ``plan.shards`` says (seeded by the learning
    settings' ``seed``); a recorded fleet (``as-recorded``) is not split, each device is a client.

    A dataset of the user's own has no learning defaults of its own: the batch sizes and learning rate not given
    are sized to its clients (:func:`~dfl_node.learning.algorithm_settings.sized_defaults` of the median client's
    training samples), filled into ``plan.learning`` — which the simulator's and the testbed's nodes are given — and
    written into every shard, so that nodes started on them (``dfl-node partition``, then ``start``) resolve the
    same."""
    data, learning, nodes = plan.shards, plan.learning, plan.nodes
    reads = task_of(learning).reads
    clients, test = (_as_recorded if data.partition == AS_RECORDED else _shared_out)(data, learning.seed, nodes, reads)
    if data.dataset in BUILTIN_DATASETS:
        return FleetData(clients, test, data.dataset)
    learning.use_defaults(sized_defaults(int(np.median([len(c.train) for c in clients]))))
    return FleetData(clients, test, learning={name: getattr(learning, name) for name in DATASET_DEPENDENT})


def _shared_out(data: ShardSettings, seed: int, nodes: int, reads: Reads) -> tuple[list[ClientData], ArrayDataset]:
    """The clients of a partition of the dataset's (pooled) training set, and the test set (with float targets,
    one stratum: an ``iid`` or ``unbalanced`` partition knows no classes)."""
    train, test = subsets(data, seed, *load_any_dataset(data.dataset, data.data_dir, data, reads))
    try:
        splits = client_splits(
            np.zeros(len(train), np.int64) if train.targets else train.y.numpy(), nodes, data.partition, seed,
            zeta=data.zeta, beta=data.beta, val_fraction=data.val_fraction,
            zeta_max=data.zeta_max, samples=data.samples, large_nodes=data.large_nodes,
        )
    except ValueError as exc:  # the operator's numbers (too many nodes for the data, a bad zeta): said in a line
        raise InputError(f"cannot split {data.dataset}'s {len(train)} training samples among {nodes} nodes "
                         f"({data.partition} partition): {exc}; give fewer --nodes or a larger --dataset "
                         "(mnist: 60,000 samples)") from None
    clients = [
        ClientData(node_id, train.subset(split.train), train.subset(split.val))
        for node_id, split in zip(fleet_ids(nodes), splits)
    ]
    return clients, test


def _as_recorded(data: ShardSettings, seed: int, nodes: int, reads: Reads) -> tuple[list[ClientData], ArrayDataset]:
    """Node i is the i-th device of the recorded fleet, with the data it recorded (:func:`load_recorded`); the test
    set a seeded subset of ``test_samples`` as :func:`subsets` draws one."""
    devices, test = load_recorded(Path(data.dataset), data, val_fraction=data.val_fraction, seed=seed, reads=reads)
    if len(devices) != nodes:  # the folder changed since its devices were counted (ExperimentConfig's nodes)
        raise InputError(f"--dataset {data.dataset} holds {len(devices)} devices now, the fleet was planned for "
                         f"{nodes}")
    clients = [ClientData(node_id, train, val) for node_id, (train, val) in zip(fleet_ids(nodes), devices)]
    return clients, _take(test, data.test_samples, seed, 2)


def write_fleet(fleet: FleetData, out_dir: Path) -> list[Path]:
    """One folder per node (``<id>/train.safetensors``, ``<id>/val.safetensors``) plus the global test set, each
    naming the dataset (:func:`node_dataset`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    folders = []
    for client in fleet.clients:
        folder = out_dir / client.node_id
        folder.mkdir(exist_ok=True)
        save_shard(folder / TRAIN_FILE, client.train, fleet.dataset, fleet.learning)
        save_shard(folder / VAL_FILE, client.val, fleet.dataset, fleet.learning)
        folders.append(folder)
    save_shard(out_dir / TEST_FILE, fleet.test, fleet.dataset, fleet.learning)
    return folders


def node_dataset(shard_dir: Path) -> str | None:
    """The dataset a node's shard folder (:func:`write_fleet`) was drawn from, whose learning defaults the node
    uses (:data:`~dfl_node.learning.algorithm_settings.PER_DATASET`); None where its training shard names none."""
    return shard_dataset(shard_dir / TRAIN_FILE)


def node_defaults(data: Path) -> dict[str, int | float]:
    """The learning defaults a node's shard carries (a shard folder of :func:`write_fleet`, or one shard file):
    its dataset's, or the fleet's that :func:`provision` sized for a dataset of the user's own; none for data that
    carries none (then sized to the node's own samples once read)."""
    meta = shard_metadata(data if data.suffix == ".safetensors" else data / TRAIN_FILE)
    if meta.get("dataset") in BUILTIN_DATASETS:
        return dataset_defaults(meta["dataset"])
    carried: dict[str, int | float] = {}
    for name in DATASET_DEPENDENT:
        try:
            value = float(meta[name]) if name == "lr" else int(meta[name])
        except (KeyError, ValueError):
            continue
        if 0 < value < float("inf"):
            carried[name] = value
    return carried
