"""REST status API: endpoints, JSON shape, Prometheus exposition, read-only-ness."""

from __future__ import annotations

import math
import re
import time

import httpx
import pytest

from dfl_node import __version__
from dfl_node.api.app import create_app
from dfl_node.api.metrics import escape_label_value, format_value, render_metrics
from dfl_node.api.schemas import Counters, HistoryEntry, NodeStatus, PeerInfo

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


class Node:
    """A fake daemon: the app only ever sees it through the two callables."""

    def __init__(self, status: NodeStatus) -> None:
        self.status = status
        self.history = list(HISTORY)
        self.status_calls = 0

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
    app = create_app(node.get_status, node.get_history)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        yield c


# ------------------------------------------------------------------------------ a tiny 0.0.4 parser

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL_START = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def parse_labels(text: str) -> dict[str, str]:
    """``a="x",b="y\\"z"`` → dict, undoing the three escapes of the text format; rejects anything else."""
    labels: dict[str, str] = {}
    i = 0
    while i < len(text):
        m = _LABEL_START.match(text, i)
        assert m, f"bad label syntax at {text[i:]!r}"
        i = m.end()
        value = []
        while True:
            assert i < len(text), f"unterminated label value in {text!r}"
            ch = text[i]
            if ch == "\\":
                nxt = text[i + 1]
                assert nxt in '\\"n', f"invalid escape \\{nxt} in {text!r}"
                value.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                assert ch != "\n"
                value.append(ch)
                i += 1
        assert m.group(1) not in labels, "duplicate label"
        labels[m.group(1)] = "".join(value)
        if i < len(text):
            assert text[i] == ",", f"expected ',' at {text[i:]!r}"
            i += 1
    return labels


def parse_exposition(text: str) -> tuple[dict[str, dict], list[tuple[str, dict[str, str], float]]]:
    """Families {name: {"help": str, "type": str}} and samples [(name, labels, value)].

    Asserts the structure of format 0.0.4: every sample is ``name{labels} value`` and belongs to a
    family whose HELP and TYPE lines came before it.
    """
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    samples = []
    for line in text.splitlines():
        assert line.strip(), "blank line in exposition"
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"HELP for {name} twice"
            families[name] = {"help": help_text}
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert name in families, f"TYPE before HELP for {name}"
            assert "type" not in families[name]
            assert kind in {"counter", "gauge", "untyped", "summary", "histogram"}
            families[name]["type"] = kind
        else:
            assert not line.startswith("#")
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.group(1), m.group(2), m.group(3)
            assert name in families and "type" in families[name], f"sample {name} without HELP/TYPE"
            samples.append((name, parse_labels(labels or ""), float(value)))
    for name, fam in families.items():
        assert "type" in fam, f"{name} has HELP but no TYPE"
    return families, samples


def sample(samples, name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


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


async def test_metrics_exposition(client: httpx.AsyncClient) -> None:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families, samples = parse_exposition(r.text)
    expected = {
        "dfl_round": "gauge",
        "dfl_models_sent_total": "counter",
        "dfl_models_received_total": "counter",
        "dfl_bytes_sent_total": "counter",
        "dfl_bytes_received_total": "counter",
        "dfl_fusions_total": "counter",
        "dfl_rejected_total": "counter",
        "dfl_peers": "gauge",
        "dfl_local_accuracy": "gauge",
        "dfl_global_accuracy": "gauge",
    }
    for name, kind in expected.items():
        assert families.get(name, {}).get("type") == kind, name
        assert families[name]["help"], name
    for name, fam in families.items():
        if fam["type"] == "counter":
            assert name.endswith("_total"), name
    assert all(labels.get("node") == "node-a" for _, labels, _ in samples)
    assert sample(samples, "dfl_round") == 7
    assert sample(samples, "dfl_models_sent_total") == 3
    assert sample(samples, "dfl_models_received_total") == 4
    assert sample(samples, "dfl_bytes_sent_total") == 1234567
    assert sample(samples, "dfl_bytes_received_total") == 2345678
    assert sample(samples, "dfl_fusions_total") == 4
    assert sample(samples, "dfl_peers") == 1  # one of the two peers is alive
    assert sample(samples, "dfl_local_accuracy") == pytest.approx(0.8125)
    assert sample(samples, "dfl_global_accuracy") == pytest.approx(0.75)
    # Label escaping: the reason with '"', '\' and a newline comes back intact after unescaping.
    assert sample(samples, "dfl_rejected_total", reason="swarm_mismatch") == 2
    assert sample(samples, "dfl_rejected_total", reason=NASTY_REASON) == 1
    assert 'reason="bad \\"fingerprint\\" \\\\ in C:\\\\models\\nsecond line"' in r.text


async def test_metrics_omit_missing_accuracy(client: httpx.AsyncClient, node: Node) -> None:
    node.status = make_status(local_accuracy=None, global_accuracy=None, rejected={}, peers=[])
    r = await client.get("/metrics")
    families, samples = parse_exposition(r.text)
    assert "dfl_local_accuracy" not in r.text and "dfl_global_accuracy" not in r.text
    assert "dfl_rejected_total" in families  # HELP/TYPE stay, no samples
    assert not [s for s in samples if s[0] == "dfl_rejected_total"]
    assert sample(samples, "dfl_peers") == 0


def test_escaping_and_value_formatting() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert format_value(3) == "3"
    assert format_value(True) == "1"
    assert format_value(0.5) == "0.5"
    assert format_value(math.nan) == "NaN"
    assert format_value(-math.inf) == "-Inf"
    # Node ids with odd characters are escaped in every sample.
    text = render_metrics(make_status(id='we"ird\\id'))
    _, samples = parse_exposition(text)
    assert {labels["node"] for _, labels, _ in samples} == {'we"ird\\id'}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/status", "/history", "/metrics", "/healthz"])
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

    app = create_app(broken, node.get_history)
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
