"""REST status API: endpoints, JSON shape, Prometheus exposition, read-only-ness."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from dfl_node import __version__
from dfl_node.records.counters import Counters
from dfl_node.records.history import HistoryEntry
from dfl_node.records.status import NodeStatus
from tests.helpers.rest import NASTY_REASON, FakeRestNode, make_status

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


async def test_status_is_fresh_on_every_request(client: httpx.AsyncClient, node: FakeRestNode) -> None:
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
async def test_read_only(client: httpx.AsyncClient, node: FakeRestNode, method: str, path: str) -> None:
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


async def test_failing_status_provider_gives_503(node: FakeRestNode) -> None:
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
