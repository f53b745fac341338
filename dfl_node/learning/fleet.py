"""Provisioning a fleet: one experiment config → each client's private train/validation data.

The simulator and the testbed (which writes the shards that real daemons read) both call
:func:`provision`, so a node of a testbed holds exactly the data of the simulator's client of the
same id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dfl_node.config import ExperimentConfig
from dfl_node.learning.datasets import ArrayDataset, load_dataset, load_shard, save_shard, shard_dataset
from dfl_node.learning.models import ModelSpec, spread
from dfl_node.learning.partitions import client_splits

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
    """Load the dataset and split it into ``config.nodes`` clients as the config says (seeded)."""
    train, test = subsets(config, *load_dataset(config.dataset, config.data_dir))
    splits = client_splits(
        train.y.numpy(), config.nodes, config.partition, config.seed,
        zeta=config.zeta, beta=config.beta, val_fraction=config.val_fraction,
        zeta_max=config.zeta_max, samples=config.samples, large_nodes=config.large_nodes,
    )
    clients = [
        ClientData(node_id, train.subset(split.train), train.subset(split.val))
        for node_id, split in zip(fleet_ids(config.nodes), splits)
    ]
    return Fleet(clients, test, config.dataset)


def write_fleet(fleet: Fleet, out_dir: Path) -> list[Path]:
    """One folder per node (``<id>/train.safetensors``, ``<id>/val.safetensors``) plus the global test set, each
    naming the dataset (:func:`node_dataset`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    folders = []
    for client in fleet.clients:
        folder = out_dir / client.node_id
        folder.mkdir(exist_ok=True)
        save_shard(folder / TRAIN_FILE, client.train, fleet.dataset)
        save_shard(folder / VAL_FILE, client.val, fleet.dataset)
        folders.append(folder)
    save_shard(out_dir / TEST_FILE, fleet.test, fleet.dataset)
    return folders


def node_dataset(shard_dir: Path) -> str | None:
    """The dataset a node's shard folder (:func:`write_fleet`) was drawn from, whose learning defaults the node
    uses (:data:`~dfl_node.learning.settings.PER_DATASET`); None where its training shard names none."""
    return shard_dataset(shard_dir / TRAIN_FILE)


def read_node_data(shard_dir: Path) -> tuple[ArrayDataset, ArrayDataset]:
    """A node's own (train, val) shard as written by :func:`write_fleet` (``dfl-node partition``)."""
    train_path, val_path = shard_dir / TRAIN_FILE, shard_dir / VAL_FILE
    if not train_path.is_file() or not val_path.is_file():
        raise FileNotFoundError(
            f"{shard_dir} must hold {TRAIN_FILE} and {VAL_FILE}; create them with `dfl-node partition`"
        )
    return load_shard(train_path), load_shard(val_path)
