"""What an operator sees of a running fleet: ``/metrics`` by the book, ``/fleet``, and the INFO lines.

One real fleet (three daemons on loopback, six rounds) is run once for the module; each test reads one thing
from what it served and logged. ``/metrics`` is parsed with ``prometheus_client``'s own parser and checked by
``promtool check metrics`` (Debian's ``prometheus`` package; CI installs it). The metric names are the contract
of ``deploy/grafana`` (tests/test_deploy_monitoring.py): every one of them must be served.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from dfl_node.records.metrics import NodeMetrics
from dfl_node.testbed.launcher import NodeProcess, wait_until
from tests.helpers.fleet import FLEET, loopback_fleet
from tests.helpers.metric_names import HISTOGRAMS, KNOWN
from tests.helpers.rest import make_status

pytestmark = pytest.mark.slow
ROUNDS = 6


@dataclass
class Served:
    """What one node served once the fleet was done, and what it logged by the time it stopped."""

    node: NodeProcess
    metrics: str
    status: dict
    history: list[dict]
    fleet: dict
    log: str


@pytest.fixture(scope="module")
def served(fleet_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    config = FLEET.model_copy(update={"nodes": 3, "rounds": ROUNDS})
    with loopback_fleet(fleet_shards, tmp_path_factory.mktemp("fleet"), "defkt", config, mdns=False,
                        static_peers=True) as nodes:
        wait_until(nodes, lambda s: all(v is not None and v["done"] for v in s.values()), timeout=120)
        pages = {}
        with httpx.Client(timeout=10) as client:
            for node in nodes:  # a peer's row is as of its last heartbeat reply: until each says it is done
                deadline = time.monotonic() + 30
                while not all(m["done"] for m in client.get(node.url + "/fleet").json()["members"]):
                    assert time.monotonic() < deadline, f"{node.id}'s /fleet never saw every member done"
                    time.sleep(0.2)
            for node in nodes:
                pages[node.id] = {path: client.get(node.url + path) for path in ("/metrics", "/status", "/history",
                                                                                 "/fleet")}
    # the fleet has stopped (SIGTERM): every log is complete
    yield {node.id: Served(node, pages[node.id]["/metrics"].text, pages[node.id]["/status"].json(),
                           pages[node.id]["/history"].json(), pages[node.id]["/fleet"].json(),
                           node.log_path.read_text()) for node in nodes}


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, suffix: str = "", **labels: str) -> float:
    found = [s.value for s in family.samples
             if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family.name, suffix, labels, found)
    return found[0]


# ----------------------------------------------------------------------------- /metrics


def test_metrics_parse_and_serve_every_name_of_the_dashboards_contract(served: dict[str, Served]) -> None:
    for node_id, page in served.items():
        parsed = families(page.metrics)
        exposed = {sample.name for family in parsed.values() for sample in family.samples}
        exposed |= {f"{name}_total" for name, family in parsed.items() if family.type == "counter"}  # none yet
        bases = {name.removesuffix(suffix) for name in exposed for suffix in ("_bucket", "_sum", "_count", "_created")
                 if name.endswith(suffix)} | exposed
        assert bases >= KNOWN, sorted(KNOWN - bases)
        for family in parsed.values():  # every sample carries the node's id
            assert all(s.labels.get("node") == node_id for s in family.samples), family.name


def test_metrics_agree_with_status_and_histograms_saw_the_work(served: dict[str, Served]) -> None:
    for page in served.values():
        parsed, status = families(page.metrics), page.status
        assert value(parsed["dfl_sent_bytes"], "_total") == status["bytes_sent"] > 0
        assert value(parsed["dfl_received_bytes"], "_total") == status["bytes_received"] > 0
        assert value(parsed["dfl_round"]) == status["round"] == ROUNDS
        # every byte counted is one model's size observed, in either direction
        sizes = parsed["dfl_model_size_bytes"]
        assert value(sizes, "_sum", direction="sent") == status["bytes_sent"]
        assert value(sizes, "_sum", direction="received") == status["bytes_received"]
        roles = parsed["dfl_role_duration_seconds"]
        played = sum(s.value for s in roles.samples if s.name.endswith("_count"))
        assert played == status["rounds_completed"] > 0
        assert value(parsed["dfl_train_duration_seconds"], "_count") >= played  # each role trains first
        assert value(parsed["dfl_transfer_duration_seconds"], "_count", direction="sent") == status["models_sent"]
        if status["fusions"]:
            assert value(parsed["dfl_fusion_duration_seconds"], "_count") == status["fusions"]
            assert value(parsed["dfl_transfer_duration_seconds"], "_count", direction="received") == \
                status["models_received"]
        assert value(parsed["process_resident_memory_bytes"]) > 10e6
        assert value(parsed["process_start_time_seconds"]) > 1.7e9


def test_metrics_pass_promtool(served: dict[str, Served]) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/install-browser-and-promtool does)"
    for page in served.values():
        checked = subprocess.run([promtool, "check", "metrics"], input=page.metrics, text=True, capture_output=True,
                                 timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_status_metrics_follow_prometheus_naming() -> None:
    """Counters end in ``_total``, base units are in the names, accuracy is absent (not 0) until evaluated, and
    a label value with quotes, backslashes and a newline survives the round trip."""
    nasty = 'bad "fingerprint" \\ in C:\\models\nsecond line'
    parsed = families(NodeMetrics("node-a", lambda: make_status(rejected={nasty: 3})).render().decode())
    for name, family in parsed.items():
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), name
    assert value(parsed["dfl_rejected"], "_total", reason=nasty) == 3
    assert "dfl_sent_bytes" in parsed and "dfl_uptime_seconds" not in parsed
    assert set(HISTOGRAMS) <= set(parsed)
    empty = families(NodeMetrics("n", lambda: make_status(local_accuracy=None, global_accuracy=None)).render().decode())
    assert "dfl_local_accuracy_ratio" not in empty and "dfl_global_accuracy_ratio" not in empty


# ----------------------------------------------------------------------------- /fleet


def test_fleet_shows_every_member_with_its_round_role_accuracy_and_a_link(served: dict[str, Served]) -> None:
    urls = {page.node.id: page.node.url for page in served.values()}
    for node_id, page in served.items():
        members = {m["id"]: m for m in page.fleet["members"]}
        assert list(members)[0] == node_id and members[node_id]["is_self"]
        assert set(members) == set(served)
        for member_id, member in members.items():
            assert member["status_url"] == urls[member_id]
            assert member["round"] == ROUNDS and member["done"] and member["alive"]
            assert member["role"] in ("idle", "holder", "sender", "aggregator")
            assert 0 < member["local_accuracy"] <= 1
        assert page.fleet["token"] is not None and page.fleet["token"]["epoch"] >= 1
        holders = [m["id"] for m in members.values() if m["holding"]]
        assert holders in ([], [page.fleet["token"]["holder"]])  # one holder at most: the newest claim
        recent = page.fleet["recent"]
        assert recent and {e["event"] for e in recent} <= {"send", "fusion"}
        exchanged = [(h["round"], h["event"]) for h in page.history if h["event"] in ("send", "fusion")]
        assert [(e["round"], e["event"]) for e in recent] == exchanged  # the same events, the same rounds


# ----------------------------------------------------------------------------- INFO lines

EXCHANGE = re.compile(r"(?P<node>node-\d+): round (?P<round>\d+)/(?P<of>\d+): (?P<what>sent to|fused) (?P<peer>\S+) "
                      r"as (?P<role>sender|aggregator|source), (?P<bytes>[\d.]+ \w+ in )?(?P<seconds>[\d.]+) s"
                      r"(?P<accuracy>; accuracy local [\d.]+%, global [\d.]+%)?$", re.MULTILINE)


def test_info_lines_say_addresses_exchanges_progress_summary_and_stopped(served: dict[str, Served]) -> None:
    for node_id, page in served.items():
        log = page.log
        assert f"{node_id} serving gRPC on 127.0.0.1:{page.node.grpc_port}" in log
        assert f"{node_id}: dashboard and REST API on http://127.0.0.1:{page.node.http_port}/" in log
        exchanges = [m.groupdict() for m in EXCHANGE.finditer(log)]
        assert exchanges and all(e["node"] == node_id and int(e["of"]) == ROUNDS for e in exchanges)
        assert all(e["bytes"] for e in exchanges if e["what"] == "sent to")  # a send moves a model
        # the accuracy where the node evaluated: the curve's points (--eval-every), not after every change
        assert all(bool(e["accuracy"]) == (int(e["round"]) % FLEET.eval_every == 0) for e in exchanges), exchanges
        # one line per send or fusion, numbered as /history numbers it
        history = [(h["round"], "sent to" if h["event"] == "send" else "fused") for h in page.history
                   if h["event"] in ("send", "fusion")]
        assert [(int(e["round"]), e["what"]) for e in exchanges] == history
        summary = re.search(rf"{node_id}: done after {ROUNDS} rounds: (\d+) sends, (\d+) fusions, .* sent, "
                            r".* received; accuracy local [\d.]+%, global [\d.]+%", log)
        assert summary and int(summary[1]) == page.status["models_sent"] and int(summary[2]) == page.status["fusions"]
        assert log.count("done after") == 1
        assert re.search(rf"{node_id} stopped at round {ROUNDS} \(checkpoint in ", log)
        assert re.search(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", log, re.MULTILINE)  # dated timestamps
