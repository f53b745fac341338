"""Stopping and batch use: ``dfl-node stop STATE_DIR`` stops the node running there, as SIGTERM does
(its state saved, its folder released), and ``--exit-when-done`` makes a node with ``--rounds`` exit 0 once the
fleet is done, so it can be a batch job or a script step. Real daemons on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfl_node.node.model.persistence import STATE_FILE
from dfl_node.node.model.state_lock import StateLock
from dfl_node.testbed.launcher import wait_until
from tests.helpers.cli import error_lines, invoke
from tests.helpers.fleet import FLEET, loopback_fleet

pytestmark = pytest.mark.slow


def test_stop_stops_the_node_of_a_state_dir_and_says_when_none_runs(fleet_shards: Path, tmp_path: Path,
                                                                     clean_env: None) -> None:
    config = FLEET.model_copy(update={"nodes": 1})
    with loopback_fleet(fleet_shards, tmp_path, "defkt", config, mdns=False, extra={"min_peers": 5}) as nodes:
        node = nodes[0]
        wait_until(nodes, lambda s: s[node.id] is not None, timeout=60)
        assert node.process is not None and StateLock.holder(node.state_dir) == node.process.pid
        result = invoke("stop", str(node.state_dir.parent))  # the folder of node folders: every node in it
        assert result.exit_code == 0 and f"(pid {node.process.pid})" in result.output, result.output
        assert node.process.wait(timeout=5) == 0  # it had exited when stop returned; SIGTERM is a clean exit
        assert (node.state_dir / STATE_FILE).exists() and StateLock.holder(node.state_dir) is None
    again = invoke("stop", str(node.state_dir))
    assert again.exit_code == 1 and again.output.strip() == f"error: no node runs in {node.state_dir}"


def test_nodes_that_exit_when_done_end_with_code_0_after_their_rounds(fleet_shards: Path, tmp_path: Path) -> None:
    config = FLEET.model_copy(update={"nodes": 3, "rounds": 4})
    with loopback_fleet(fleet_shards, tmp_path, "defkt", config, mdns=False, static_peers=True,
                        extra={"exit_when_done": True, "evaluate": False}) as nodes:
        codes = [n.process.wait(timeout=120) for n in nodes if n.process is not None]
    assert codes == [0, 0, 0]
    for node in nodes:
        state = json.loads((node.state_dir / STATE_FILE).read_text())
        assert state["round"] == 4 and state["done"], (node.id, state)
        assert "done, exiting (--exit-when-done)" in node.log_path.read_text()


def test_exit_when_done_needs_an_end(tmp_path: Path, clean_env: None) -> None:
    result = invoke("start", "--exit-when-done", "--id", "n", "--data", str(tmp_path))
    assert result.exit_code == 2 and error_lines(result) == [
        "Error: --exit-when-done needs an end: --rounds (round mode) or --duration (async mode)"]
