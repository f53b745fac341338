"""``dfl-node status``: real uvicorn servers on loopback, queried by :func:`show_status`."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from dfl_node.api.status_cli import show_status
from dfl_node.records.history import HistoryEntry
from dfl_node.records.peers import PeerInfo
from dfl_node.records.status import NodeStatus
from dfl_node.records.urls import normalize_url, peer_url
from tests.helpers.rest import app_of


class FakeNode:
    """Status of a fake node; its peers are filled in once every server knows its port."""

    def __init__(self, node_id: str, round_: int, accuracy: float | None) -> None:
        self.id = node_id
        self.round = round_
        self.accuracy = accuracy
        self.http_port = 0
        self.peers: list[PeerInfo] = []

    def status(self) -> NodeStatus:
        return NodeStatus(
            id=self.id, swarm="test-swarm", algorithm="defkt", mode="round", round=self.round, role="idle",
            peers=self.peers, local_accuracy=self.accuracy, global_accuracy=None,
            models_sent=self.round, models_received=self.round + 1, fusions=self.round,
            rejected={"swarm_mismatch": 2} if self.id == "alpha" else {},
            boot_id=f"boot-{self.id}", uptime_s=1.0, grpc_address="127.0.0.1:1", http_port=self.http_port,
            unreachable_peers=["nosuchhost.invalid:50051"] if self.id == "alpha" else [],
        )

    def history(self) -> list[HistoryEntry]:
        return []


class ServerThread:
    """uvicorn on 127.0.0.1 with an ephemeral port, in a background thread."""

    def __init__(self, app) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> int:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:  # wait for uvicorn to say it is listening
            assert self.thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, FakeNode]]:
    alpha, beta = FakeNode("alpha", 11, 0.875), FakeNode("beta", 12, None)
    servers = [ServerThread(app_of(n.status, n.history)) for n in (alpha, beta)]
    try:
        alpha.http_port, beta.http_port = (s.start() for s in servers)
        now = time.time()
        alpha.peers = [
            PeerInfo(id="beta", address="127.0.0.1:50052", http_port=beta.http_port, last_seen=now, alive=True),
            # A peer that is in the table but whose HTTP server is gone.
            PeerInfo(id="ghost", address="127.0.0.1:50053", http_port=free_port(), last_seen=now - 60, alive=False),
        ]
        beta.peers = [
            PeerInfo(id="alpha", address="127.0.0.1:50051", http_port=alpha.http_port, last_seen=now, alive=True),
        ]
        yield {"alpha": alpha, "beta": beta}
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich must not wrap or truncate the tables


def url_of(node: FakeNode) -> str:
    return f"http://127.0.0.1:{node.http_port}"


def test_table_of_one_node(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["alpha"])) == 0
    out = capsys.readouterr().out
    assert "alpha" in out
    assert "11" in out  # round
    assert "87.50%" in out  # local accuracy
    assert "defkt" in out and "round" in out and "idle" in out
    assert "swarm_mismatch: 2" in out
    assert "1/2 alive" in out
    assert "beta" in out and "ghost" in out  # peer table
    assert re.search(r"static peers not answering +│? *nosuchhost\.invalid:50051", out)


def test_a_node_whose_static_peers_answer_shows_no_such_row(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["beta"])) == 0
    assert "not answering" not in capsys.readouterr().out


def test_json_of_one_node(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["beta"]), as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["id"] == "beta" and data["round"] == 12
    assert data["local_accuracy"] is None
    assert [p["id"] for p in data["peers"]] == ["alpha"]
    NodeStatus.model_validate(data)


def test_all_lists_both_nodes_and_the_unreachable_peer(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["alpha"]), all_peers=True, wide=True) == 1  # a node is down: a script sees it
    lines = capsys.readouterr().out.splitlines()
    alpha = [ln for ln in lines if "alpha" in ln]
    beta = [ln for ln in lines if "beta" in ln]
    ghost = [ln for ln in lines if "ghost" in ln]
    assert len(alpha) == 1 and len(beta) == 1 and len(ghost) == 1, lines
    assert "11" in alpha[0] and "87.50%" in alpha[0]
    assert "12" in beta[0] and str(fleet["beta"].http_port) in beta[0]
    assert "unreachable" in ghost[0]
    assert "unreachable" not in alpha[0] + beta[0]


def test_all_as_json(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    # From beta's point of view the fleet is beta and alpha.
    assert show_status(url_of(fleet["beta"]), all_peers=True, as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list)
    assert [(d["id"], d["round"]) for d in data] == [("beta", 12), ("alpha", 11)]
    # And from alpha's, the dead peer is an entry with an error, not a crash (and the exit code says so).
    assert show_status(url_of(fleet["alpha"]), all_peers=True, as_json=True) == 1
    data = {d["id"]: d for d in json.loads(capsys.readouterr().out)}
    assert set(data) == {"alpha", "beta", "ghost"}
    assert data["beta"]["round"] == 12
    assert data["ghost"]["reachable"] is False and data["ghost"]["error"]


def test_all_fits_80_columns_in_a_pipe_and_wide_shows_every_column(fleet, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped or at 80 columns every cell of --all once was "…", so a script polling it never saw "done"."""
    monkeypatch.setenv("COLUMNS", "80")
    assert show_status(url_of(fleet["beta"]), all_peers=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines), lines
    beta = next(line for line in lines if "beta" in line)
    assert [cell.strip() for cell in beta.split("│")[1:-1]] == ["beta", "12", "idle", "–", "–", "12", "1/1", "ok"]
    monkeypatch.setenv("COLUMNS", "200")
    assert show_status(url_of(fleet["beta"]), all_peers=True, wide=True) == 0
    assert "sent/recv" in capsys.readouterr().out


def test_watch_shows_the_fleet_again(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["beta"]), all_peers=True, watch=0.1, repeats=3) == 0
    assert capsys.readouterr().out.count("dfl-node fleet") == 3


def test_url_forms_are_accepted(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    port = fleet["alpha"].http_port
    for url in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}/status"):
        assert show_status(url, as_json=True) == 0, url
        assert json.loads(capsys.readouterr().out)["id"] == "alpha"


def test_unreachable_node_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    assert show_status(url, timeout=2.0) == 1
    assert time.monotonic() - t0 < 5
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error" in captured.err and "cannot reach" in captured.err and url in captured.err
    assert "Traceback" not in captured.err
    assert show_status(url, as_json=True) == 1
    assert capsys.readouterr().out == ""


def test_non_dfl_server_exits_1(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    # A URL that is not a node's base URL (…/healthz/status does not exist): a clear error, exit 1.
    assert show_status(url_of(fleet["alpha"]) + "/healthz") == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_peer_url() -> None:
    assert peer_url({"address": "10.0.0.2:50051", "http_port": 8080}, "http://x:1") == "http://10.0.0.2:8080"
    assert peer_url({"address": "[fe80::1]:50051", "http_port": 8080}, "http://x:1") == "http://[fe80::1]:8080"
    assert peer_url({"address": "0.0.0.0:50051", "http_port": 9}, "http://node.lan:1") == "http://node.lan:9"
    assert peer_url({"address": "10.0.0.2:50051", "http_port": None}, "http://x:1") is None
    announced = {"address": "node-1:50051", "http_port": 8080, "status_url": "http://127.0.0.1:8081/"}
    assert peer_url(announced, "http://127.0.0.1:8080") == "http://127.0.0.1:8081"  # compose: the published port
    assert normalize_url("host:8080/status/") == "http://host:8080"


def test_wait_done_waits_for_a_node_that_starts_late_and_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    """--wait-done: a node not yet listening is asked again, one not yet done too; once done the table shows it."""
    node, port = FakeNode("gamma", 3, 0.5), free_port()
    answers = 0

    def status() -> NodeStatus:
        nonlocal answers
        answers += 1
        return node.status().model_copy(update={"done": answers >= 3})  # done from its third answer on

    server = ServerThread(app_of(status, node.history))
    server.server.config.port = port
    starter = threading.Timer(0.6, server.start)  # the node starts listening while the status waits
    starter.start()
    try:
        assert show_status(f"http://127.0.0.1:{port}", wait_done=30) == 0
    finally:
        starter.join()
        server.stop()
    assert answers >= 4 and "gamma" in capsys.readouterr().out  # three polls to get there, then the table's


def test_wait_done_gives_up_with_exit_1(fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert show_status(url_of(fleet["alpha"]), all_peers=True, wait_done=0.3) == 1
    captured = capsys.readouterr()
    assert "not done after 0.3 s" in captured.err and "alpha" in captured.out  # what stands is shown
