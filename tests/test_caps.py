"""A node's caps on its model transfers, held by real daemons: node-0 may send 100 kB/s and receive 50 kB/s
(``--max-upload``, ``--max-download``). Over a run of Def-KT rounds — four in which it sends its 104 kB model, two in
which it receives one — the throughput each end measured of every transfer is within 10 % of the cap that bound it,
and ``/status``, ``/fleet`` and ``/metrics`` show the caps and the measured throughput per peer."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dfl_node.algorithms.base import sample_pairs
from dfl_node.learning.provision import fleet_ids, provision, write_fleet
from dfl_node.testbed.launcher import Placement, all_done, plan_fleet, wait_until
from tests.helpers.fleet import FLEET, running_daemons

pytestmark = pytest.mark.slow
CONFIG = FLEET.model_copy(update={"nodes": 2, "rounds": 6, "eval_every": 6, "hidden": [128, 128]})
UP, DOWN = 100_000, 50_000


def test_a_node_holds_its_upload_and_download_caps_within_ten_percent(tmp_path) -> None:
    sends = [g.senders[0] for r in range(CONFIG.rounds) for g in sample_pairs(CONFIG.learning.seed, r, fleet_ids(2), 1)]
    assert "node-0" in sends and "node-1" in sends  # the seed has node-0 send and receive
    shards = tmp_path / "shards"
    write_fleet(provision(CONFIG), shards)
    nodes = plan_fleet(CONFIG, "defkt", shards, tmp_path, [Placement("127.0.0.1")] * 2, swarm="caps", mdns=False,
                       static_peers=True)
    nodes[0].env.update({"DFL_MAX_UPLOAD": "100k", "DFL_MAX_DOWNLOAD": str(DOWN)})
    with running_daemons(nodes):
        statuses = wait_until(nodes, all_done, timeout=90)
        with httpx.Client(trust_env=False) as http:
            fleet = http.get(f"{nodes[0].url}/fleet").json()
            metrics = http.get(f"{nodes[0].url}/metrics").text
    capped, other = statuses["node-0"], statuses["node-1"]
    assert (capped["max_upload"], capped["max_download"]) == (UP, DOWN) and other["max_upload"] == 0
    [link] = [p["link"] for p in capped["peers"]]
    assert link["sent_bytes_per_s"] == pytest.approx(UP, rel=0.1)  # what node-0 measured sending…
    assert link["received_bytes_per_s"] == pytest.approx(DOWN, rel=0.1)  # …and receiving
    [theirs] = [p["link"] for p in other["peers"]]
    print(json.dumps({"node-0's link to node-1": link, "node-1's to node-0": theirs}))
    assert theirs["sent_bytes_per_s"] == pytest.approx(DOWN, rel=0.1)  # node-1 sent no faster than node-0 read
    assert theirs["received_bytes_per_s"] == pytest.approx(UP, rel=0.1)
    assert link["transfers"] == CONFIG.rounds and not link["weak"]
    [row] = [m["link"] for m in fleet["members"] if m["id"] == "node-1"]
    assert row == link  # /fleet shows the same
    gauges = {(s.labels["peer"], s.labels["direction"]): s.value for family in text_string_to_metric_families(metrics)
              for s in family.samples if family.name == "dfl_link_throughput_bytes_per_second"}
    assert gauges == {("node-1", "sent"): link["sent_bytes_per_s"],
                      ("node-1", "received"): link["received_bytes_per_s"]}
    assert f"dfl_max_upload_bytes_per_second{{node=\"node-0\"}} {float(UP)}" in metrics
