"""A fleet across NAT, in network namespaces: 3 sites of 3 daemons, the last two sites behind masquerading
routers (no port forwarding, no route in: ``tests/test_nat_sites.py`` checks that), every home node given one
``--join`` address, of a public node, and no mDNS: nothing but the internet's rules.

- **Round mode, swarm key, a relay killed.** Every node knows every other within :data:`KNOWN_WITHIN_S`; the six
  home nodes find out that nobody can dial them and are relayed by the three public ones; mid-run the busiest relay
  is killed with SIGKILL: the nodes it relayed take slots on the other relays within :data:`RELAYED_AGAIN_S`, and
  the relay, restarted, plays on. The 30 rounds complete with home nodes as holder, sender and aggregator (Def-KT's
  receiver), and the durable record shows no round lost or fused twice, no accepted model lost; no node but the
  killed relay was ever declared dead (in any of the three runs).
- **Round mode, mutual TLS.** The same fleet, undisturbed, ends with the simulator's models (the same fleet on one
  LAN) bit for bit.
- **Async mode.** Home nodes fuse at a rate within 1.5× of the public ones.

Each run prints its figures (roles, times, relay load), which docs/nat.md quotes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from dfl_node.learning.provision import provision, write_fleet
from dfl_node.net.certs import init_ca, issue_node, new_secret
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.sim.ledger import Ledger, completed_rounds
from dfl_node.testbed.launcher import GRPC_PORT, NodeProcess, Placement, all_done, plan_fleet, wait_until
from dfl_node.testbed.netns import list_namespaces
from dfl_node.testbed.sites import SitesTopology
from tests.chaos import durable_states, expected_fingerprint
from tests.helpers.fleet import running_daemons, simulated

pytestmark = [pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
SITES, PER_SITE, NAT_SITES = 3, 3, 2
FLEET9 = ExperimentConfig(nodes=SITES * PER_SITE, partition="iid", seed=3, rounds=30, eval_every=10, batch_size=20,
                          mkt_batch_size=20, lr=0.05, hidden=[32, 32])
TIMEOUTS = {"heartbeat": 0.5, "peer_timeout": 3.0}
KNOWN_WITHIN_S = 30.0  # the last daemon's start (9 on 2 cores take ~10 s) + its dial-back and slot + gossip
RELAYED_AGAIN_S = 15.0  # a relay dies: its reservations end at once, a new slot is one call, then gossip spreads it


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nat-shards")
    write_fleet(provision(FLEET9), out)
    return out


@contextlib.contextmanager
def nat_fleet(shards: Path, workdir: Path, mode: str, security: str, **extra: object
              ) -> Iterator[tuple[SitesTopology, list[NodeProcess]]]:
    """The fleet, running (stopped, and every namespace removed, on the way out)."""
    with SitesTopology(SITES, PER_SITE, nat=NAT_SITES, prefix="dflnat") as topology:
        places = [Placement(h.address, h.name, [topology.join_address(i, GRPC_PORT)])
                  for i, h in enumerate(topology.hosts)]
        nodes = plan_fleet(FLEET9, "defkt", shards, workdir, places, swarm=f"nat-{uuid.uuid4().hex[:8]}", mode=mode,
                           mdns=False, extra={**TIMEOUTS, **extra})
        credentials = _credentials(workdir, security, topology)
        with running_daemons(nodes, per_node=lambda node_id: credentials[node_id], stop_grace=20, log_lines=8):
            yield topology, nodes
    assert not [n for n in list_namespaces() if n.startswith(topology.tag)]


def _credentials(workdir: Path, security: str, topology: SitesTopology) -> dict[str, dict[str, object]]:
    """Each node's: the swarm key, or a certificate of one CA naming its id and address; none with ``insecure``
    (the testbed's private bridge, where its REST API needs no token either: ``--insecure`` stays for it)."""
    ids = [f"node-{i}" for i in range(len(topology.hosts))]
    if security == "swarm-key":
        key = new_secret(workdir / "swarm.key")
        return {i: {"swarm_key_file": key} for i in ids}
    if security == "mtls":
        init_ca(workdir / "ca")
        for node_id, host in zip(ids, topology.hosts, strict=True):
            issue_node(workdir / "ca", node_id, workdir / node_id, ips=(host.address,))
        return {i: {"tls_dir": workdir / i} for i in ids}
    return {i: {} for i in ids}


def home(topology: SitesTopology, nodes: list[NodeProcess]) -> set[str]:
    return {n.id for i, n in enumerate(nodes) if topology.is_behind_nat(i)}


def everyone_known(statuses: dict[str, dict | None]) -> bool:
    return all(s is not None and sum(p["alive"] for p in s["peers"]) == len(statuses) - 1 for s in statuses.values())


def relayed_as_known(statuses: dict[str, dict | None], relayed: set[str]) -> bool:
    """Every one of ``relayed`` holds a slot, and every node knows it there."""
    if not all(statuses.get(r) and statuses[r]["reachability"] == "relayed" for r in relayed):  # type: ignore[index]
        return False
    return all(any(p["id"] == r and p["alive"] and p["address"] == statuses[r]["grpc_address"]  # type: ignore[index]
                   for p in s["peers"]) for r in relayed for i, s in statuses.items() if i != r and s is not None)


def declared_dead(nodes: list[NodeProcess]) -> set[str]:
    """The members some node's SWIM declared dead, from the nodes' logs (``node-2: node-0 dead (suspect for …)``)."""
    return {m[1] for n in nodes for m in re.finditer(r": (\S+) dead \(suspect", n.log_path.read_text())}


def test_round_mode_across_nat_through_a_relay_killed_mid_run(shards: Path, tmp_path: Path) -> None:
    with nat_fleet(shards, tmp_path, "round", "swarm-key") as (topology, nodes):
        started = time.monotonic()
        behind = home(topology, nodes)
        wait_until(nodes, lambda s: everyone_known(s) and relayed_as_known(s, behind), timeout=90)
        known_s = time.monotonic() - started
        before = wait_until(nodes, lambda s: all(v and v["round"] >= 10 for v in s.values()), timeout=120)
        assert {i for i, s in before.items() if s["reachability"] == "relayed"} == behind
        assert {s["relay"] for i, s in before.items() if i in behind} <= {n.id for n in nodes} - behind

        # the busiest relay dies
        victim = max((n for n in nodes if n.id not in behind), key=lambda n: before[n.id]["relaying"]["slots"])
        moved = {i for i, s in before.items() if s["relay"] == victim.id}
        assert moved
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)
        killed = time.monotonic()
        others = [n for n in nodes if n is not victim]
        after = wait_until(others, lambda s: all(s[i]["relay"] not in (None, victim.id) for i in moved)
                           and relayed_as_known(s, moved), timeout=60)
        relayed_again_s = time.monotonic() - killed
        victim.start()  # same namespace, same state: it resumes and plays on
        final = wait_until(nodes, all_done, timeout=240)
    states = durable_states(nodes, expected_fingerprint(shards, FLEET9))
    ledger, completed = Ledger.of(states), completed_rounds(states)
    held = {i: states[i]["counters"].get("rounds_held", 0) for i in states}
    roles = {"holder": sum(held[i] for i in behind), "sender": sum(1 for s, _, _ in ledger.sends if s in behind),
             "aggregator": sum(1 for a, _, _, _ in ledger.fusions if a in behind)}
    print(json.dumps({"known_s": round(known_s, 1), "relayed_again_s": round(relayed_again_s, 1),
                      "moved": sorted(moved), "victim": victim.id, "home_roles": roles,
                      "rounds_held": held, "relaying": {i: final[i]["relaying"] for i in final if i not in behind},
                      "global_accuracy": statistics.fmean(s["global_accuracy"] for s in final.values())}))
    assert known_s <= KNOWN_WITHIN_S and relayed_again_s <= RELAYED_AGAIN_S
    assert declared_dead(nodes) <= {victim.id}  # no false death: a relayed node that moved was never given up
    assert all(after[i]["relay"] != victim.id for i in moved)
    assert completed == FLEET9.rounds
    assert ledger.lost_rounds(completed) == [] and ledger.repeated_rounds() == [] and ledger.lost_models() == []
    assert all(count > 0 for count in roles.values()), roles
    assert sum(final[n.id]["relaying"]["bytes"] for n in nodes) > 0


def test_round_mode_across_nat_under_mutual_tls_learns_as_on_one_lan(shards: Path, tmp_path: Path) -> None:
    with nat_fleet(shards, tmp_path, "round", "mtls") as (topology, nodes):
        statuses = wait_until(nodes, all_done, timeout=240)
        behind = home(topology, nodes)
    result, models = simulated(FLEET9, "defkt", tmp_path / "sim")
    for node in nodes:
        mine = load_file(str(node.state_dir / "model.safetensors"))
        assert max(float((mine[k] - models[node.id][k]).abs().max()) for k in mine) == 0.0, node.id
    assert {i for i, s in statuses.items() if s["reachability"] == "relayed"} == behind
    assert all(s["rejected"] == {} for s in statuses.values()), {i: s["rejected"] for i, s in statuses.items()}
    assert declared_dead(nodes) == set()
    print(json.dumps({"global_accuracy": {"nat": statistics.fmean(s["global_accuracy"] for s in statuses.values()),
                                          "one_lan_simulated": result.global_accuracy}}))


def test_async_mode_across_nat_home_nodes_fuse_as_often_as_public_ones(shards: Path, tmp_path: Path) -> None:
    with nat_fleet(shards, tmp_path, "async", "insecure", interval=1.0, duration=40.0) as (topology, nodes):
        statuses = wait_until(nodes, all_done, timeout=150)
        behind = home(topology, nodes)
    rate = {side: statistics.fmean(s["fusions"] for i, s in statuses.items() if (i in behind) == (side == "home"))
            for side in ("home", "public")}
    print(json.dumps({"fusions_per_node": rate, "relaying": {i: s["relaying"] for i, s in statuses.items()}}))
    assert rate["home"] > 0 and rate["public"] > 0 and declared_dead(nodes) == set()
    assert max(rate.values()) / min(rate.values()) <= 1.5, rate
