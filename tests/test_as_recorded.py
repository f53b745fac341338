"""A recorded fleet simulated as it was recorded: ``--partition as-recorded`` makes each subfolder (or
file) of ``--dataset FOLDER`` one node, with the validation split its daemon would make and the folder's ``test.*``
as the global test set; a partition that pools files refuses a folder with subfolders rather than read half of it.

Every sample carries its device's index (sorted by name) and its serial number in its features, so a node's data
can be traced back to the files it came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dfl_node.cli.testbed import TESTBED_DEFAULTS
from dfl_node.learning.datasets import ArrayDataset, load_shard
from dfl_node.learning.provision import TEST_FILE, TRAIN_FILE, VAL_FILE, fleet_ids, provision, write_fleet
from dfl_node.node.core.clock import Clock
from dfl_node.node.model.data_watch import NodeData
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.loading import load_config
from dfl_node.settings.node import NodeConfig
from tests.helpers.cli import error_lines, invoke
from tests.helpers.data_files import write_csv

DEVICES = {"east": 40, "north": 55, "south": 30}  # device → samples, in sorted order (index = node)
CLASSES, TEST_MARK = 3, 99.0
SOUTH_VAL = 8  # south has a val.npz of its own: its validation set, as a daemon reads one


def samples(device: int, serials: range) -> tuple[np.ndarray, np.ndarray]:
    """Features (device index, serial number), label serial mod 3: every sample says where it came from."""
    x = np.column_stack([np.full(len(serials), device), np.array(serials)]).astype(np.float32)
    return x, np.array(serials, dtype=np.int64) % CLASSES


def origins(data: ArrayDataset) -> set[tuple[int, int]]:
    """The (device, serial) of each sample."""
    return {(int(d), int(s)) for d, s in data.x.numpy()}


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """Three devices' folders (north's data in a CSV and an NPZ file, south with its own val.npz) and a test.npz."""
    root = tmp_path / "fleet"
    for name in ("north", "south", "east"):
        (root / name).mkdir(parents=True)
    north, south, east = 1, 2, 0
    write_csv(root / "north" / "morning.csv", *samples(north, range(30)))
    np.savez(root / "north" / "evening.npz", **dict(zip("xy", samples(north, range(30, 55)))))
    np.savez(root / "south" / "log.npz", **dict(zip("xy", samples(south, range(DEVICES["south"] - SOUTH_VAL)))))
    np.savez(root / "south" / "val.npz", **dict(zip("xy", samples(south, range(DEVICES["south"] - SOUTH_VAL,
                                                                            DEVICES["south"])))))
    np.savez(root / "east" / "data.npz", **dict(zip("xy", samples(east, range(DEVICES["east"])))))
    x, y = samples(0, range(12))
    x[:, 0] = TEST_MARK
    np.savez(root / "test.npz", x=x, y=y)
    (root / "README.md").write_text("not data: neither a device nor a problem")
    return root


def test_each_device_is_a_node_with_its_own_data_split_as_its_daemon_splits_it(fleet: Path) -> None:
    config = ExperimentConfig(dataset=str(fleet), partition="as-recorded", seed=5)
    assert config.nodes == len(DEVICES)  # taken from the folder
    data = provision(config)
    assert [c.node_id for c in data.clients] == fleet_ids(3)
    for index, (client, (name, count)) in enumerate(zip(data.clients, DEVICES.items())):
        train, val = origins(client.train), origins(client.val)
        assert train | val == {(index, serial) for serial in range(count)} and not train & val, name
        assert client.train.num_classes == client.val.num_classes == CLASSES
        # what `dfl-node start --data fleet/NAME --seed 5` holds: the same samples, in the same order
        node = NodeConfig(id=name, data=fleet / name, seed=5)
        daemon = NodeData(name, node.local, node.learning, Clock())
        assert torch.equal(client.train.x, daemon.train.x) and torch.equal(client.train.y, daemon.train.y), name
        assert torch.equal(client.val.x, daemon.val.x) and torch.equal(client.val.y, daemon.val.y), name
    east, north, south = data.clients
    assert abs(len(east.val) - 0.2 * DEVICES["east"]) <= CLASSES  # every class holds back a fifth, to one sample
    assert abs(len(north.val) - 0.2 * DEVICES["north"]) <= 2 * CLASSES  # in each of its two files
    assert origins(south.val) == {(2, s) for s in range(DEVICES["south"] - SOUTH_VAL, DEVICES["south"])}
    test_x, test_y = samples(0, range(12))
    test_x[:, 0] = TEST_MARK
    assert torch.equal(data.test.x, torch.from_numpy(test_x)) and torch.equal(data.test.y, torch.from_numpy(test_y))
    assert data.learning  # a dataset of the user's own: learning defaults sized to the nodes, as for any partition


def test_devices_may_be_files_and_without_a_test_file_their_held_out_data_tests(tmp_path: Path) -> None:
    for index, name in enumerate(("a.csv", "b.npz", "c.npz")):
        x, y = samples(index, range(20 + index))
        if name.endswith(".csv"):
            write_csv(tmp_path / name, x, y)
        else:
            np.savez(tmp_path / name, x=x, y=y)
    data = provision(ExperimentConfig(dataset=str(tmp_path), partition="as-recorded"))
    assert [{d for d, _ in origins(c.train)} for c in data.clients] == [{0}, {1}, {2}]
    assert origins(data.test) == set().union(*(origins(c.val) for c in data.clients))


def test_shards_read_back_as_recorded_are_the_fleet_they_were(fleet: Path, tmp_path: Path) -> None:
    """``partition``'s folder (a ``train`` and a ``val`` shard per node, ``test.safetensors``) is a recorded fleet."""
    written = provision(ExperimentConfig(dataset=str(fleet), partition="as-recorded"))
    write_fleet(written, tmp_path / "shards")
    again = provision(ExperimentConfig(dataset=str(tmp_path / "shards"), partition="as-recorded"))
    pairs = [(a.train, b.train) for a, b in zip(written.clients, again.clients, strict=True)]
    pairs += [(a.val, b.val) for a, b in zip(written.clients, again.clients)] + [(written.test, again.test)]
    assert all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in pairs)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("verb", ["simulate", "partition"])
def test_a_partition_that_pools_refuses_a_folder_with_subfolders(fleet: Path, tmp_path: Path, verb: str) -> None:
    """Before, the files at the top were pooled and the devices' subfolders left unread, silently."""
    np.savez(fleet / "loose.npz", **dict(zip("xy", samples(7, range(30)))))
    args = ("--out", str(tmp_path / "shards")) if verb == "partition" else ("--quiet",)
    result = invoke(verb, "--dataset", str(fleet), "--partition", "dirichlet", *args)
    assert result.exit_code == 2
    assert error_lines(result) == [
        f"error: --dataset {fleet}: its subfolders hold data files (east, north, south), which a partition of "
        "pooled files would not read; to run each subfolder (or file) as a device, give --partition as-recorded, "
        "or move their files to the top of the folder"]


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("verb", ["simulate", "testbed", "partition"])
def test_a_number_of_nodes_that_is_not_the_devices_is_one_line(fleet: Path, tmp_path: Path, verb: str) -> None:
    """Said as the settings are read: a testbed starts no daemon."""
    out = ("--out", str(tmp_path / "shards")) if verb == "partition" else ()
    result = invoke(verb, "--dataset", str(fleet), "--partition", "as-recorded", "--nodes", "4", *out)
    assert result.exit_code == 2
    assert error_lines(result) == [f"Error: --nodes 4: dataset {fleet} holds 3 devices, a node each (partition "
                                   "as-recorded); leave --nodes out"]
    assert not (tmp_path / "shards").exists()


@pytest.mark.usefixtures("clean_env")
def test_a_verbs_preset_number_of_nodes_gives_way_to_the_devices(fleet: Path) -> None:
    """The testbed's preset says 4 nodes (the demo's 10): not the operator's word, so the folder's 3 stand."""
    given = {"dataset": str(fleet), "partition": "as-recorded"}
    assert load_config(ExperimentConfig, overrides=given, preset=TESTBED_DEFAULTS).nodes == 3
    assert load_config(ExperimentConfig, overrides={**given, "nodes": 3}, preset=TESTBED_DEFAULTS).nodes == 3


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(("given", "problem"), [
    (("--dataset", "digits"), "partition as-recorded reads a folder of recorded devices (a subfolder or a data file "
                              "each); dataset digits is none"),
    (("--dataset", "FOLDER", "--train-samples", "50"), "--train-samples: partition as-recorded keeps every device's "
                                                       "samples as recorded; leave it out"),
])
def test_as_recorded_settings_it_cannot_honour_are_one_line(fleet: Path, given: tuple[str, ...],
                                                            problem: str) -> None:
    args = [str(fleet) if arg == "FOLDER" else arg for arg in given]
    result = invoke("simulate", "--quiet", "--partition", "as-recorded", *args)
    assert result.exit_code == 2 and error_lines(result) == [f"Error: {problem}"]


@pytest.mark.usefixtures("clean_env")
def test_a_device_folder_with_subfolders_of_data_is_refused(fleet: Path, tmp_path: Path) -> None:
    (fleet / "east" / "2024").mkdir()
    np.savez(fleet / "east" / "2024" / "jan.npz", **dict(zip("xy", samples(0, range(10)))))
    result = invoke("partition", "--dataset", str(fleet), "--partition", "as-recorded", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert error_lines(result) == [f"error: --dataset {fleet}, device east: its subfolders hold data files (2024), "
                                   f"which its node would not read; move their files to the top of {fleet / 'east'}"]


@pytest.mark.usefixtures("clean_env")
def test_partition_writes_each_devices_shard(fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    result = invoke("partition", "--dataset", str(fleet), "--partition", "as-recorded", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote 3 shards ({fleet}, as-recorded) and test set to {out}" in result.output
    assert "devices: node-0 east, node-1 north, node-2 south" in result.output
    for index, node in enumerate(fleet_ids(3)):
        held = origins(load_shard(out / node / TRAIN_FILE)) | origins(load_shard(out / node / VAL_FILE))
        assert held == {(index, serial) for serial in range(list(DEVICES.values())[index])}
    assert {d for d, _ in origins(load_shard(out / TEST_FILE))} == {int(TEST_MARK)}


@pytest.mark.usefixtures("clean_env")
def test_simulate_runs_a_recorded_fleet(fleet: Path, tmp_path: Path) -> None:
    result = invoke("simulate", "--dataset", str(fleet), "--partition", "as-recorded", "--algorithm", "defkt",
                    "--rounds", "2", "--eval-every", "1", "--hidden", "8", "--quiet", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "out" / "defkt.json").read_text())
    assert [node["id"] for node in run["nodes"]] == fleet_ids(3) and run["rounds"] == 2
    assert [node["num_train"] for node in run["nodes"]] == [len(c.train) for c in provision(
        ExperimentConfig(dataset=str(fleet), partition="as-recorded", seed=run["config"]["seed"])).clients]
