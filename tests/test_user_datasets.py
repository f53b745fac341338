"""A dataset of the user's own in ``simulate`` and ``partition``: a CSV file or folder, or a
``dfl_node.datasets`` plugin, shared out by every partition; learning defaults sized to it, the same on every node
of a fleet; and no silent fallback to digits."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from dfl_node.errors import InputError
from dfl_node.learning.algorithm_settings import DATASET_DEPENDENT, sized_defaults
from dfl_node.learning.datasets import load_shard, shard_metadata
from dfl_node.learning.partitions import PARTITIONS
from dfl_node.learning.provision import TEST_FILE, TRAIN_FILE, VAL_FILE, fleet_ids, provision, write_fleet
from dfl_node.node.core.clock import Clock
from dfl_node.node.model.data_watch import NodeData
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.sim import run_fleet
from tests.helpers.cli import error_lines, invoke
from tests.helpers.data_files import blobs, write_csv

ROWS, FEATURES, CLASSES = 600, 5, 3


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 rows of 5 features, 3 classes, one CSV file with a header."""
    return write_csv(tmp_path_factory.mktemp("tabular") / "sensors.csv", *blobs(ROWS, FEATURES, CLASSES, seed=11))


def learning(config: NodeConfig | ExperimentConfig) -> dict[str, int | float]:
    return {name: getattr(config.learning, name) for name in DATASET_DEPENDENT}


def node_data(config: NodeConfig) -> NodeData:
    """The data of the node ``config`` describes, as it reads it at start (sizing the learning defaults it lacks)."""
    return NodeData(config.id, config.local, config.learning, Clock())


# ----------------------------------------------------------------------------- partition and simulate


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("scheme", PARTITIONS)
def test_partition_shares_a_csv_dataset_out_by_every_scheme(table: Path, tmp_path: Path, scheme: str) -> None:
    done = invoke("partition", "--dataset", str(table), "--nodes", "4", "--partition", scheme, "--out",
                  str(tmp_path))
    assert done.exit_code == 0, done.output
    test = load_shard(tmp_path / TEST_FILE)
    assert len(test) == ROWS // 5 and test.input_shape == (FEATURES,) and test.num_classes == CLASSES
    held = 0
    for node in fleet_ids(4):
        train, val = load_shard(tmp_path / node / TRAIN_FILE), load_shard(tmp_path / node / VAL_FILE)
        assert train.input_shape == (FEATURES,) and len(train) > 0
        held += len(train) + len(val)
    assert held <= ROWS - len(test)
    assert "learning settings in every shard: batch_size" in done.output


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_simulate_runs_a_csv_dataset_under_every_partition(table: Path, tmp_path: Path, scheme: str) -> None:
    config = ExperimentConfig(dataset=str(table), nodes=4, partition=scheme, rounds=2, eval_every=2, hidden=[16],
                              seed=1)
    result = run_fleet(config, "defkt", tmp_path)
    shards = tmp_path / "shards"
    sizes = {node.id: node.num_train for node in result.nodes}
    assert sizes == {node: len(load_shard(shards / node / TRAIN_FILE)) for node in fleet_ids(4)}
    assert load_shard(shards / "node-0" / TRAIN_FILE).input_shape == (FEATURES,)
    assert result.rounds == 2 and all(0 <= node.global_accuracy <= 1 for node in result.nodes)
    model = load_file(str(tmp_path / "defkt" / "node-0" / "model.safetensors"))
    assert any(t.ndim == 2 and t.shape[1] == FEATURES for t in model.values())  # its first layer reads 5 features


def test_a_fleet_on_csv_data_learns_in_the_simulator(table: Path, tmp_path: Path) -> None:
    config = ExperimentConfig(dataset=str(table), nodes=4, partition="iid", rounds=20, eval_every=20, seed=2)
    result = run_fleet(config, "defkt", tmp_path)
    assert result.global_accuracy > 0.6, result.global_accuracy  # chance: 1/3 (measured 0.70)


@pytest.mark.usefixtures("clean_env")
def test_simulate_given_a_folder_of_csv_as_data_dir_says_so(table: Path) -> None:
    """`simulate --data-dir FOLDER-OF-CSV` ran the embedded digits, silently."""
    result = invoke("simulate", "--quiet", "--data-dir", str(table.parent))
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: --data-dir: {table.parent} holds data files of your own (sensors.csv), "
                                   f"which --dataset digits (embedded) does not read; to use them, give --dataset "
                                   f"{table.parent}"]


@pytest.mark.usefixtures("clean_env")
def test_a_dataset_path_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    result = invoke("simulate", "--quiet", "--dataset", str(tmp_path / "none.csv"))
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: --dataset: {tmp_path / 'none.csv'}: no such file or folder"]


def test_a_folder_dataset_takes_its_test_file_as_the_global_test_set(tmp_path: Path) -> None:
    x, y = blobs(300, FEATURES, CLASSES, seed=12)
    write_csv(tmp_path / "a.csv", x[:100], y[:100])
    write_csv(tmp_path / "b.csv", x[100:250], y[100:250])
    write_csv(tmp_path / "test.csv", x[250:], y[250:])
    fleet = provision(ExperimentConfig(dataset=str(tmp_path), nodes=2))
    assert len(fleet.test) == 50
    assert sum(len(c.train) + len(c.val) for c in fleet.clients) == 250


# ----------------------------------------------------------------------------- dataset plugins

PLUGIN = '''
import numpy as np

from dfl_node.learning.datasets import ArrayDataset


def make(data_dir):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 400)
    x = rng.standard_normal((400, 2, 3)) + y[:, None, None]
    train = (x[:300], y[:300])                     # a pair of arrays
    import torch
    test = ArrayDataset(torch.from_numpy(x[300:]).float(), torch.from_numpy(y[300:]), 4)  # or an ArrayDataset
    return train, test


def broken(data_dir):
    raise RuntimeError("no sensor attached")
'''


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's, ``user_blobs``, importable; and an installed distribution declaring it as the
    ``dfl_node.datasets`` entry point ``blobs`` (a dist-info folder on the path, as pip would write it)."""
    (tmp_path / "user_blobs.py").write_text(PLUGIN)
    info = tmp_path / "user_blobs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-blobs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dfl_node.datasets]\nblobs = user_blobs:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_blobs"


@pytest.mark.parametrize("dataset", ["blobs", "user_blobs:make"])
def test_a_dataset_plugin_is_shared_out_like_any_dataset(plugin_module: str, tmp_path: Path, dataset: str) -> None:
    config = ExperimentConfig(dataset=dataset, nodes=3, partition="dirichlet", seed=4)
    fleet = provision(config)
    assert fleet.test.input_shape == (2, 3) and fleet.num_classes == 4 and len(fleet.test) == 100
    assert sum(len(c.train) + len(c.val) for c in fleet.clients) == 300
    assert learning(config) == sized_defaults(int(np.median([len(c.train) for c in fleet.clients])))


@pytest.mark.usefixtures("clean_env")
def test_installed_dataset_plugins_are_offered_by_help(plugin_module: str) -> None:
    assert "blobs" in invoke("simulate", "--help").output


def test_a_failing_plugin_is_one_line(plugin_module: str) -> None:
    with pytest.raises(InputError, match="^dataset user_blobs:broken failed: RuntimeError: no sensor attached$"):
        provision(ExperimentConfig(dataset="user_blobs:broken", nodes=2))
    with pytest.raises(InputError, match="^cannot load user_blobs:nonesuch: AttributeError"):
        provision(ExperimentConfig(dataset="user_blobs:nonesuch", nodes=2))


# ----------------------------------------------------------------------------- learning defaults sized to the data


def test_a_nodes_own_csv_gets_defaults_sized_to_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """216 rows once got B = 200 and lr 0.01, one SGD step an epoch, silently."""
    path = write_csv(tmp_path / "dev1.csv", *blobs(270, 6, 3, seed=13))
    config = NodeConfig(id="dev1", data=path, num_classes=3)
    with caplog.at_level(logging.INFO, logger="dfl_node"):
        data = node_data(config)
    assert len(data.train) == 216
    assert learning(config) == {"batch_size": 16, "mkt_batch_size": 16, "lr": 0.05} == sized_defaults(216)
    assert [r.getMessage() for r in caplog.records] == [
        f"dev1: data {path}: 216 training + 54 validation samples of shape (6,), 3 classes, in 1 file; batch size "
        f"16, MKT batch size 16, lr 0.05 (sized to its 216 training samples)"]
    given = NodeConfig(id="dev1", data=path, batch_size=50, lr=0.2, num_classes=3)
    node_data(given)
    assert learning(given) == {"batch_size": 50, "mkt_batch_size": 16, "lr": 0.2}


def test_inferred_classes_are_stated_at_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_csv(tmp_path / "dev1.csv", *blobs(100, 6, 3, seed=13))
    with caplog.at_level(logging.WARNING, logger="dfl_node"):
        node_data(NodeConfig(id="dev1", data=path))
    assert [r.getMessage() for r in caplog.records] == [
        f"dev1: 3 classes, inferred from the largest label in {path}: every node of a fleet must have the same (a "
        f"device that never saw the last class infers fewer, and its model fits no peer's); give --num-classes 3 to "
        f"fix it"]


def test_a_fleets_nodes_agree_when_their_shards_differ_in_size(table: Path, tmp_path: Path) -> None:
    """Shards of an unbalanced partition, 4 to 1 in size: every node started on them takes the fleet's values,
    which the partition sized to its median node and wrote into every shard (what `partition` then `start` do)."""
    config = ExperimentConfig(dataset=str(table), nodes=5, partition="unbalanced", large_nodes=1, seed=5)
    fleet = provision(config)
    sizes = sorted(len(c.train) for c in fleet.clients)
    assert sizes[-1] >= 4 * sizes[0]
    assert len({sized_defaults(n)["batch_size"] for n in sizes}) > 1  # their own counts would disagree
    write_fleet(fleet, tmp_path)
    nodes = [NodeConfig(id=node, data=tmp_path / node) for node in fleet_ids(5)]
    assert all(learning(node) == learning(config) == fleet.learning for node in nodes)
    for node in nodes:
        node_data(node)  # read: nothing left to size
        assert learning(node) == fleet.learning


def test_a_builtin_dataset_keeps_its_defaults_and_writes_none(tmp_path: Path) -> None:
    fleet = provision(ExperimentConfig(nodes=2))
    assert fleet.learning == {} and fleet.dataset == "digits"
    write_fleet(fleet, tmp_path)
    assert shard_metadata(tmp_path / "node-0" / TRAIN_FILE) == {"num_classes": "10", "dataset": "digits"}
