"""A fleet of real daemons on CSV files: three ``dfl-node start`` on loopback, each given only its own
folder of CSV files (no learning settings: they are sized to the data), learn; a file appended to one node's
folder while they run raises its sample count in ``/status`` and is trained on; a corrupt file put in another's is
skipped, counted and logged once, and the fleet goes on.

One run of the fleet (a module fixture) serves every test here: each asserts one of those outcomes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfl_node.learning.algorithm_settings import DATASET_DEPENDENT, sized_defaults
from dfl_node.learning.provision import fleet_ids, provision
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.launcher import Placement, done_twice, fetch_json, plan_fleet, wait_until
from tests.helpers.fleet import running_daemons

ROUNDS, APPEND_AT = 30, 3
CONFIG = ExperimentConfig(nodes=3, partition="iid", seed=7, rounds=ROUNDS, eval_every=10)
EXTRA_SHARE = 0.4  # of node-0's samples, held back to be appended while it runs
CHANCE = 0.1


def write_rows(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """A user's CSV file: a header, 64 pixel columns, the label last; written beside and renamed into place, as
    a device should (a reader never sees half a file)."""
    names = ",".join([f"p{i}" for i in range(x.shape[1])] + ["label"])
    temporary = path.with_name(f".{path.name}.tmp")
    np.savetxt(temporary, np.column_stack([x, y]), delimiter=",", header=names, comments="",
               fmt=["%g"] * x.shape[1] + ["%d"])
    os.replace(temporary, path)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The embedded digits as a user's tabular data: each node's share a CSV file in its own folder (8x8 pixels
    flattened, 64 columns), the test set a CSV file too. Three daemons run ``ROUNDS`` rounds; at round
    ``APPEND_AT`` node-0's folder gets a new file (the rest of its share) and node-1's a corrupt one."""
    root = tmp_path_factory.mktemp("csv-fleet")
    fleet = provision(CONFIG)
    flat = lambda data: (data.x.reshape(len(data), -1).numpy(), data.y.numpy())  # noqa: E731
    held_back: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for client in fleet.clients:
        x, y = (np.concatenate(parts) for parts in zip(flat(client.train), flat(client.val)))
        keep = len(y) - int(EXTRA_SHARE * len(y)) if client.node_id == "node-0" else len(y)
        (root / client.node_id).mkdir()
        write_rows(root / client.node_id / "readings-1.csv", x[:keep], y[:keep])
        held_back[client.node_id] = x[keep:], y[keep:]
    write_rows(root / "test.csv", *flat(fleet.test))
    (root / "run").mkdir()
    nodes = plan_fleet(CONFIG, "defkt", root, root / "run", [Placement("127.0.0.1")] * 3, swarm="csv", mdns=False,
                       static_peers=True, extra={"test_data": root / "test.csv", "num_classes": 10, "data_poll": 0.3})
    for node in nodes:  # as a user starts them: no learning settings
        for name in DATASET_DEPENDENT:
            del node.env[f"DFL_{name.upper()}"]
    with running_daemons(nodes):
        wait_until(nodes, lambda s: all(v is not None and v["round"] >= APPEND_AT for v in s.values()), timeout=120)
        first = fetch_json(nodes, "/status")
        write_rows(root / "node-0" / "readings-2.csv", *held_back["node-0"])
        rows = [",".join([f"p{i}" for i in range(64)] + ["label"]), ",".join(["0.5"] * 64 + ["3"]),
                ",".join(["0.5"] * 5 + ["oops"] + ["0.5"] * 58 + ["1"])]  # a sensor's glitch in row 3
        (root / "node-1" / "broken.csv").write_text("\n".join(rows) + "\n")
        grown = wait_until(nodes, lambda s: all(v is not None for v in s.values())
                           and s["node-0"]["data"]["updates"] >= 1 and s["node-1"]["data"]["bad_files"] >= 1,
                           timeout=60)
        final = wait_until(nodes, done_twice(), timeout=300)
        history = fetch_json(nodes, "/history", timeout=5.0)
    logs = {node.id: node.log_path.read_text() for node in nodes}
    return {"first": first, "grown": grown, "final": final, "history": history, "logs": logs, "root": root,
            "extra": len(held_back["node-0"][1])}


@pytest.mark.slow
def test_a_fleet_of_daemons_learns_from_csv_files(run: dict[str, Any]) -> None:
    final = run["final"]
    assert all(s["round"] == ROUNDS and s["done"] for s in final.values()), final
    local = [s["local_accuracy"] for s in final.values()]
    global_ = [s["global_accuracy"] for s in final.values()]
    assert min(local) > 6 * CHANCE and min(global_) > 6 * CHANCE, (local, global_)  # chance: 0.1
    for node_id in fleet_ids(3):  # sized to their data, stated at start: not B = 200 for 230 to 380 samples
        count = run["first"][node_id]["data"]["train_samples"]
        batch = sized_defaults(count)["batch_size"]
        assert batch < 64 and (f"batch size {batch}, MKT batch size {batch}, lr 0.05 (sized to its {count} training "
                               "samples)") in run["logs"][node_id], node_id


@pytest.mark.slow
def test_a_file_added_to_a_nodes_folder_is_counted_and_trained_on(run: dict[str, Any]) -> None:
    before, after = run["first"]["node-0"]["data"], run["final"]["node-0"]["data"]
    assert (before["files"], after["files"], after["updates"]) == (1, 2, 1)
    assert after["train_samples"] + after["val_samples"] == before["train_samples"] + before["val_samples"] + \
        run["extra"]
    assert after["train_samples"] > before["train_samples"] and after["updated"] > before["updated"]
    # trained on: node-0 played training roles (local SGD as a sender, MKT over its data as a receiver) after
    # the swap, which replaced the data those roles read
    trained = [e for e in run["history"]["node-0"] if e["time"] > after["updated"] and e["event"] in ("send", "fusion")]
    assert trained, run["history"]["node-0"][-5:]
    assert "data changed: " in run["logs"]["node-0"] and "used from the next round on" in run["logs"]["node-0"]
    for other in ("node-1", "node-2"):  # the others' data did not change
        assert run["final"][other]["data"]["updates"] == 0


@pytest.mark.slow
def test_a_corrupt_file_is_skipped_counted_and_logged_once_and_the_fleet_goes_on(run: dict[str, Any]) -> None:
    before, after = run["first"]["node-1"]["data"], run["final"]["node-1"]["data"]
    broken = run["root"] / "node-1" / "broken.csv"
    problem = f"{broken} row 3: column 'p5': 'oops' is not a number"
    assert after["bad_files"] == 1 and after["skipped_versions"] == 1
    assert after["skipped"] == {"broken.csv": problem}
    assert (after["train_samples"], after["val_samples"], after["files"]) == \
        (before["train_samples"], before["val_samples"], 1)
    warnings = [line for line in run["logs"]["node-1"].splitlines() if "data file skipped" in line]
    assert len(warnings) == 1 and problem in warnings[0] and "WARNING" in warnings[0], warnings
    assert "Traceback" not in run["logs"]["node-1"]
    assert run["final"]["node-1"]["round"] == ROUNDS  # and the fleet went on to its last round
