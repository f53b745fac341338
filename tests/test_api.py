"""REST status API: endpoints, JSON shape, Prometheus exposition, read-only-ness."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from dfl_node import __version__
from dfl_node.api.app import create_app
from dfl_node.records.counters import Counters
from dfl_node.records.fleet import FleetMember, FleetView
from dfl_node.records.history import HistoryEntry
from dfl_node.records.metrics import NodeMetrics
from dfl_node.records.peers import PeerInfo
from dfl_node.records.status import NodeStatus

NASTY_REASON = 'bad "fingerprint" \\ in C:\\models\nsecond line'


def make_status(**overrides) -> NodeStatus:
    fields = dict(
        id="node-a",
        swarm="swarm-1",
        algorithm="defkt",
        mode="round",
        round=7,
        role="receiver",
        peers=[
            PeerInfo(id="node-b", address="127.0.0.1:50052", http_port=8082, last_seen=1700000000.5, alive=True,
                     algorithm="defkt"),
            PeerInfo(id="node-c", address="10.0.0.3:50053", http_port=None, last_seen=1699999000.0, alive=False),
        ],
        local_accuracy=0.8125,
        global_accuracy=0.75,
        models_sent=3,
        models_received=4,
        bytes_sent=1234567,
        bytes_received=2345678,
        fusions=4,
        rounds_completed=6,
        busy_refusals=1,
        rejected={"swarm_mismatch": 2, NASTY_REASON: 1},
        boot_id="boot-123",
        uptime_s=42.5,
        grpc_address="127.0.0.1:50051",
        http_port=8081,
        param_sha256="ab" * 32,
        fusing=True,
        done=False,
    )
    fields.update(overrides)
    return NodeStatus(**fields)


HISTORY = [
    HistoryEntry(round=1, time=1.0, event="train", role="sender", peer=None, local_accuracy=0.5),
    HistoryEntry(round=2, time=2.0, event="fusion", role="receiver", peer="node-b", local_accuracy=0.6,
                 detail={"loss": 0.25, "epochs": 2, "kind": "mkt"}),
    HistoryEntry(round=3, time=3.0, event="eval", role="idle", peer=None, local_accuracy=0.7, global_accuracy=0.65),
]


class Served:
    """A fake node as the REST app sees it (a :class:`~dfl_node.api.served_node.ServedNode`): its status and history
    those of ``status`` and ``history``, its fleet itself alone, its metrics those of its status, and no model yet."""

    def __init__(self, status: Callable[[], NodeStatus], history: Callable[[], list[HistoryEntry]]) -> None:
        self._status, self._history = status, history
        self.metrics = NodeMetrics("fake", status)

    def status(self) -> NodeStatus:
        return self._status()

    def history(self) -> list[HistoryEntry]:
        return self._history()

    def fleet(self) -> FleetView:
        s = self._status()
        me = FleetMember(id=s.id, is_self=True, grpc_address=s.grpc_address, alive=True, round=s.round)
        return FleetView(node=s.id, mode=s.mode, members=[me])

    async def committed_model(self) -> None:
        return None


class Node:
    """A fake daemon: the app only ever sees it through :class:`Served` (and metrics over its status)."""

    def __init__(self, status: NodeStatus) -> None:
        self.status = status
        self.history = list(HISTORY)
        self.status_calls = 0

    def app(self, status: Callable[[], NodeStatus] | None = None) -> FastAPI:
        return create_app(Served(status or self.get_status, self.get_history))

    def get_status(self) -> NodeStatus:
        self.status_calls += 1
        return self.status

    def get_history(self) -> list[HistoryEntry]:
        return list(self.history)


@pytest.fixture
def node() -> Node:
    return Node(make_status())


@pytest.fixture
async def client(node: Node):
    app = node.app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        yield c


# ---------------------------------------------------------------------------------------- endpoints


async def test_healthz(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_status_has_the_keys_the_issue_requires(client: httpx.AsyncClient) -> None:
    r = await client.get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    data = r.json()
    required = {"id", "swarm", "algorithm", "mode", "round", "role", "peers", "local_accuracy",
                "global_accuracy", "models_sent", "models_received", "bytes_sent", "bytes_received",
                "fusions", "rejected"}
    assert required <= data.keys(), required - data.keys()
    assert data["id"] == "node-a"
    assert data["swarm"] == "swarm-1"
    assert data["algorithm"] == "defkt"
    assert data["mode"] == "round"
    assert data["round"] == 7
    assert data["role"] == "receiver"
    assert data["local_accuracy"] == pytest.approx(0.8125)
    assert data["global_accuracy"] == pytest.approx(0.75)
    assert (data["models_sent"], data["models_received"]) == (3, 4)
    assert (data["bytes_sent"], data["bytes_received"]) == (1234567, 2345678)
    assert data["fusions"] == 4
    assert data["rejected"] == {"swarm_mismatch": 2, NASTY_REASON: 1}
    assert data["version"] == __version__
    assert data["boot_id"] == "boot-123"
    assert data["param_sha256"] == "ab" * 32
    assert data["fusing"] is True and data["done"] is False
    peers = {p["id"]: p for p in data["peers"]}
    assert set(peers) == {"node-b", "node-c"}
    for p in peers.values():
        assert {"id", "address", "last_seen", "alive", "http_port"} <= p.keys()
    assert peers["node-b"]["address"] == "127.0.0.1:50052"
    assert peers["node-b"]["last_seen"] == pytest.approx(1700000000.5)
    assert peers["node-b"]["http_port"] == 8082
    assert peers["node-c"]["http_port"] is None and peers["node-c"]["alive"] is False
    # The JSON round-trips into the schema the daemon fills.
    assert NodeStatus.model_validate(data) == make_status()


async def test_status_is_fresh_on_every_request(client: httpx.AsyncClient, node: Node) -> None:
    assert (await client.get("/status")).json()["round"] == 7
    node.status = make_status(round=8, role="holder", local_accuracy=None)
    data = (await client.get("/status")).json()
    assert data["round"] == 8 and data["role"] == "holder"
    assert data["local_accuracy"] is None


async def test_history_and_since(client: httpx.AsyncClient) -> None:
    r = await client.get("/history")
    assert r.status_code == 200
    entries = r.json()
    assert [e["round"] for e in entries] == [1, 2, 3]
    assert entries[1]["event"] == "fusion" and entries[1]["peer"] == "node-b"
    assert entries[1]["detail"] == {"loss": 0.25, "epochs": 2, "kind": "mkt"}
    assert isinstance(entries[1]["detail"]["epochs"], int)  # ints stay ints in the union
    assert [e["round"] for e in (await client.get("/history", params={"since": 2})).json()] == [2, 3]
    assert (await client.get("/history", params={"since": 99})).json() == []
    assert (await client.get("/history", params={"since": "two"})).status_code == 422


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/status", "/history", "/fleet", "/metrics", "/healthz"])
async def test_read_only(client: httpx.AsyncClient, node: Node, method: str, path: str) -> None:
    before = node.status.model_copy(deep=True)
    r = await client.request(method, path, json={"round": 0, "role": "sender"})
    assert r.status_code == 405
    assert "GET" in r.headers.get("allow", "")
    assert node.status == before


async def test_dashboard(client: httpx.AsyncClient) -> None:
    r = await client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "<svg" in html and "<table" in html
    assert '"status"' in html and "history" in html  # polls both endpoints (relative URLs)
    assert "2000" in html  # every 2 s
    # Self-contained: no external scripts, styles or images.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html


async def test_openapi_title_and_version(client: httpx.AsyncClient) -> None:
    info = (await client.get("/openapi.json")).json()["info"]
    assert info["title"] == "dfl-node"
    assert info["version"] == __version__


async def test_failing_status_provider_gives_503(node: Node) -> None:
    def broken() -> NodeStatus:
        raise RuntimeError("state not loaded yet")

    app = node.app(broken)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        r = await c.get("/status")
        assert r.status_code == 503
        assert "state not loaded yet" in r.json()["detail"]
        assert (await c.get("/metrics")).status_code == 503
        assert (await c.get("/healthz")).status_code == 200


def test_counters_view_matches_flattened_fields() -> None:
    s = make_status()
    assert s.counters == Counters(models_sent=3, models_received=4, bytes_sent=1234567, bytes_received=2345678,
                                  fusions=4, rounds_completed=6, busy_refusals=1)
    c = Counters(models_sent=1, fusions=2)
    s2 = make_status(**c.model_dump())
    assert s2.models_sent == 1 and s2.fusions == 2 and s2.bytes_sent == 0
    assert "counters" not in s2.model_dump()


def test_history_entry_defaults() -> None:
    e = HistoryEntry(round=0, time=time.time(), event="train", role="idle")
    assert e.peer is None and e.detail == {} and e.local_accuracy is None
