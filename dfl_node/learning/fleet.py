"""Provisioning a fleet: one experiment config → each client's private train/validation data.

The simulator and the testbed (which writes the shards that real daemons read) both call
:func:`provision`, so a node of a testbed holds exactly the data of the simulator's client of the
same id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dfl_node.config import ExperimentConfig
from dfl_node.learning.dataset_refs import BUILTIN_DATASETS
from dfl_node.learning.datasets import ArrayDataset, save_shard, shard_dataset, shard_metadata
from dfl_node.learning.models import ModelSpec, spread
from dfl_node.learning.partitions import client_splits
from dfl_node.learning.settings import DATASET_DEPENDENT, dataset_defaults, sized_defaults
from dfl_node.learning.user_datasets import load_any_dataset

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
class Fleet:
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


def architectures(config: ExperimentConfig) -> dict[str, ModelSpec]:
    """Each node's architecture: ``config.architectures`` spread evenly over the fleet (003), else
    ``model``/``hidden`` on every node. The testbed gives each daemon its own; the simulator builds them."""
    specs = config.architectures or [str(ModelSpec(config.model, tuple(config.hidden) if config.hidden else None))]
    return {node_id: ModelSpec.parse(spec) for node_id, spec in spread(specs, fleet_ids(config.nodes)).items()}


def subsets(config: ExperimentConfig, train: ArrayDataset, test: ArrayDataset) -> tuple[ArrayDataset, ArrayDataset]:
    """The seeded random ``train_samples`` / ``test_samples`` of the dataset that a CPU-sized run uses (0: all)."""
    def take(data: ArrayDataset, count: int, stream: int) -> ArrayDataset:
        if not count or count >= len(data):
            return data
        rng = np.random.default_rng([config.seed, stream])  # not the partition's stream: that stays as it was
        return data.subset(np.sort(rng.choice(len(data), size=count, replace=False)))

    return take(train, config.train_samples, 1), take(test, config.test_samples, 2)


def provision(config: ExperimentConfig) -> Fleet:
    """Load the dataset and split it into ``config.nodes`` clients as the config says (seeded).

    A dataset of the user's own has no learning defaults of its own: the batch sizes and learning rate not given
    are sized to its clients (:func:`~dfl_node.learning.settings.sized_defaults` of the median client's training
    samples), filled into ``config`` — which the simulator's and the testbed's nodes are given — and written into
    every shard, so that nodes started on them (``dfl-node partition``, then ``start``) resolve the same."""
    train, test = subsets(config, *load_any_dataset(config.dataset, config.data_dir, config))
    splits = client_splits(
        train.y.numpy(), config.nodes, config.partition, config.seed,
        zeta=config.zeta, beta=config.beta, val_fraction=config.val_fraction,
        zeta_max=config.zeta_max, samples=config.samples, large_nodes=config.large_nodes,
    )
    clients = [
        ClientData(node_id, train.subset(split.train), train.subset(split.val))
        for node_id, split in zip(fleet_ids(config.nodes), splits)
    ]
    if config.dataset in BUILTIN_DATASETS:
        return Fleet(clients, test, config.dataset)
    config.use_defaults(sized_defaults(int(np.median([len(c.train) for c in clients]))))
    return Fleet(clients, test, learning={name: getattr(config, name) for name in DATASET_DEPENDENT})


def write_fleet(fleet: Fleet, out_dir: Path) -> list[Path]:
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
    uses (:data:`~dfl_node.learning.settings.PER_DATASET`); None where its training shard names none."""
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
