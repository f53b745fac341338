"""Real daemons over a link that drops: every connection to node-0's gRPC port goes through a proxy that passes
100 kB/s each way and cuts each connection after 2 s (:class:`~dfl_node.testbed.threaded_proxy.LinkProxy`), so a 340 KB
model needs 1.7 connections' lifetimes to cross — more than the 800 kB model at 100 kB/s cut every 5 s (1.6) that
stopped a round-mode fleet before transfers resumed. Every round completes, each model crosses in less than 1.5
times its size, and the fleet ends with the simulator's models for the same seed over perfect links, bit for bit.

node-0 serves on its port and advertises another (``--advertise HOST:PORT``), where the proxy listens: its peers
reach it only through the proxy, while what it sends goes straight to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.algorithms.base import sample_pairs
from dfl_node.learning.provision import fleet_ids, provision, write_fleet
from dfl_node.testbed.launcher import Placement, all_done, plan_fleet, wait_until
from dfl_node.testbed.threaded_proxy import LinkProxy
from tests.helpers.fleet import FLEET, running_daemons, simulated

pytestmark = pytest.mark.slow
CONFIG = FLEET.model_copy(update={"nodes": 3, "rounds": 5, "eval_every": 5, "hidden": [256, 256]})
MODEL_BYTES = (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4  # the MLP's float32 parameters: 340 KB


def test_a_fleet_behind_a_link_that_drops_completes_every_round_as_the_simulator_does(tmp_path: Path) -> None:
    into = [r for r in range(CONFIG.rounds) for g in sample_pairs(CONFIG.learning.seed, r, fleet_ids(3), 1)
            if g.aggregator == "node-0"]
    assert len(into) >= 2  # the seed sends node-0 models through the proxy in several rounds
    shards = tmp_path / "shards"
    write_fleet(provision(CONFIG), shards)
    nodes = plan_fleet(CONFIG, "defkt", shards, tmp_path, [Placement("127.0.0.1")] * 3, swarm="weak", mdns=False,
                       static_peers=True, extra={"resume_window": 10.0})
    weak = nodes[0]
    with LinkProxy(target=("127.0.0.1", weak.grpc_port), rate=100_000, cut_after=2.0) as proxy:
        weak.env["DFL_ADVERTISE"] = f"127.0.0.1:{proxy.port}"  # behind the proxy
        for node in nodes[1:]:
            node.env["DFL_PEERS"] = node.env["DFL_PEERS"].replace(f":{weak.grpc_port}", f":{proxy.port}")
        with running_daemons(nodes):
            statuses = wait_until(nodes, all_done, timeout=120)
        counters = proxy.counters.as_dict()
    result, models = simulated(CONFIG, "defkt", tmp_path / "sim")
    print(json.dumps({"proxy": counters, "models_into_node_0": len(into), "model_bytes": MODEL_BYTES}))
    assert all(s["round"] == CONFIG.rounds for s in statuses.values())  # every round completed
    assert statuses["node-0"]["grpc_address"] == f"127.0.0.1:{proxy.port}"  # what its peers know and dial
    for node in nodes:  # the simulator's models over perfect links, bit for bit
        mine = load_file(str(node.state_dir / "model.safetensors"))
        assert all(torch.equal(mine[k], models[node.id][k]) for k in models[node.id]), node.id
    assert [s["param_sha256"] for s in statuses.values()] == [n.param_sha256 for n in result.nodes]
    assert counters["cut"] > 0 and statuses["node-0"]["transfers_cut"] > 0  # the link dropped transfers…
    assert statuses["node-0"]["fusions"] == len(into)  # …which resumed: each model into node-0 was fused
    # everything through the proxy to node-0 — its models and the membership's and rounds' messages — in under
    # 1.5 times the models' size: a cut transfer went on from where it stopped
    assert counters["bytes_client_to_target"] < 1.5 * MODEL_BYTES * len(into)
    senders = [s for n, s in statuses.items() if n != "node-0"]
    assert sum(s["bytes_resent"] for s in senders) > 0
    shown = [p["link"] for s in senders for p in s["peers"] if p["id"] == "node-0" and p["link"] is not None]
    assert shown and any(link["cuts"] > 0 and link["weak"] for link in shown)  # what its senders saw of the link
