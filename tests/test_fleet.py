"""Real daemons as separate processes on loopback: real gRPC, real zeroconf, real REST.

The equivalence test is the strongest check we have: a fleet of daemons in round mode and the simulator (the
same nodes on the in-memory network and the virtual clock), with the same config and seed, end with the same
models: what gRPC, the codec and real time carry changes no bit.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dfl_node.learning.provision import architectures as fleet_architectures
from dfl_node.learning.provision import provision
from dfl_node.testbed.launcher import all_done, wait_until
from tests.helpers.fleet import FLEET, loopback_fleet, simulated

pytestmark = pytest.mark.slow


def test_four_daemons_discover_by_mdns_and_run_ten_defkt_rounds(fleet_shards: Path, tmp_path: Path) -> None:
    with loopback_fleet(fleet_shards, tmp_path, "defkt", mdns=True, static_peers=False) as nodes:
        wait_until(nodes, lambda s: all(v is not None for v in s.values()), timeout=60)
        up = time.monotonic()
        wait_until(nodes, lambda s: all(sum(p["alive"] for p in v["peers"]) == 3 for v in s.values()), timeout=10)
        discovered = time.monotonic() - up
        statuses = wait_until(nodes, all_done, timeout=120)
    assert discovered < 10
    for s in statuses.values():
        assert s["round"] == 10 and s["mode"] == "round" and s["done"]
        assert sorted(p["id"] for p in s["peers"]) == sorted(n.id for n in nodes if n.id != s["id"])
        assert s["rejected"] == {} and s["max_concurrent_fusions"] <= 1
    assert sum(s["models_sent"] for s in statuses.values()) == 10  # Q = 1: one model per round
    assert sum(s["fusions"] for s in statuses.values()) == 10
    assert sum(s["bytes_sent"] for s in statuses.values()) > 10 * 4 * (64 * 32 + 32 * 32 + 32 * 10)


MIXED = ["mlp:32,32", "mlp:16"]  # two architectures, spread over the 4 nodes (nodes 0, 2 and 1, 3)
UNRELATED = ["mlp:32,32", "cnn-ln:4,8"]  # two unrelated architectures (digits' 8×8 pools to 4×4, then 2×2)


@pytest.mark.parametrize(("algorithm", "architectures", "settings"), [
    ("defkt", [], {}), ("combo", [], {}),
    ("fedavg", [], {}),  # each round: 2 senders → 1 aggregator → the average back to both
    ("fedavg", MIXED, {}),  # a mixed fleet: each architecture cluster averaged on its own
    ("gossip", [], {}),  # pull groups: the aggregator fetches its source's model (the Pull RPC)
    ("dfml", UNRELATED, {"dfml_epochs": 2}),  # 003: mutual learning across an MLP and a CNN, models sent back
    ("fml", UNRELATED, {"meme_model": "mlp:16"}),  # 004: only the shared meme models travel
    # open groups: the sender probes its candidates (here by its least certain samples) and chooses; the default
    # selection (class profiles) and fairavg (002: Pull) are test_auth's fleets ≡ the simulator, bit for bit too
    ("defkt-select", [], {"selection": "probe-samples"}),
    # differential privacy: Poisson batches and noise drawn from the seed, so daemons and simulator agree too
    ("fedavg", [], {"dp_noise": 1.0, "dp_epsilon": 50.0}),
], ids=["defkt", "combo", "fedavg", "fedavg-mixed", "gossip", "dfml-unrelated", "fml-unrelated", "defkt-select-probe",
        "fedavg-dp"])
def test_testbed_equals_simulator(fleet_shards: Path, tmp_path: Path, algorithm: str, architectures: list[str],
                                  settings: dict) -> None:
    config = FLEET.model_copy(update={"rounds": 20, "architectures": architectures, **settings})
    with loopback_fleet(fleet_shards, tmp_path, algorithm, config=config, mdns=False, static_peers=True) as nodes:
        statuses = wait_until(nodes, all_done, timeout=180)
        taken = [t for n in nodes for t in re.findall(r": taking (\S+) \((\S+)\) from ", n.log_path.read_text())]
    result, models = simulated(config, algorithm, tmp_path / "sim")
    expected = {n.id: n for n in result.nodes}
    for node in nodes:
        mine = load_file(str(node.state_dir / "model.safetensors"))
        theirs = models[node.id]  # with the algorithm's extra models (peak, meme) and α_n
        unequal = [k for k in theirs if not torch.equal(mine[k], theirs[k])]  # bit for bit, as README says
        assert not unequal, (f"{node.id}: max abs difference "
                             f"{max(float((mine[k] - theirs[k]).abs().max()) for k in unequal)}")
        for field in ("global_accuracy", "local_accuracy", "models_sent", "model"):
            assert statuses[node.id][field] == getattr(expected[node.id], field), (node.id, field)
        assert (statuses[node.id]["privacy"] or {}).get("epsilon") == expected[node.id].epsilon
    if algorithm == "defkt-select":  # every round the sender probed its 3 candidates, and each answered
        assert sum(s["probes_sent"] for s in statuses.values()) == 20 * 3
        assert sum(s["probes_answered"] for s in statuses.values()) == 20 * 3
        assert sum(s["probes_unanswered"] for s in statuses.values()) == 0
    if algorithm in ("dfml", "fml"):  # the transfer log: every model an aggregator took, and its architecture
        assert len(taken) == sum(s["models_sent"] for s in statuses.values()) == 20 * 2
    if algorithm == "fml":  # local models never leave their node: only meme models were on the wire
        assert set(taken) == {("fml.meme", "mlp:16")}
    if algorithm == "dfml":  # both architectures reached aggregators, and the peak rule kept some peak models back
        assert {model for _, model in taken} == set(UNRELATED)
        assert any(not torch.equal(state[f"aux:peak:{k}"], state[k]) for state in models.values()
                   for k in state if not k.startswith(("aux:", "scalar:")))
    specs, data = fleet_architectures(config.architectures, config.learning, config.nodes), provision(config)
    assert len({str(spec) for spec in specs.values()}) == (2 if architectures else 1)
    for nid, state in models.items():  # every node learned: the comparison is not one of untouched w0s
        w0 = specs[nid].build(data.input_shape, data.num_classes, seed=config.learning.seed).state_dict()
        first = next(iter(w0))
        assert not torch.equal(state[first], w0[first]), nid


