"""Nodes behind NAT in the simulator: a device class with ``nat: true`` serves where nobody can dial it.
Each such node finds that out (dial-backs that fail), holds a slot on a reachable member chosen by rendezvous hashing,
and is reached through it for everything — the daemon's own code (:mod:`dfl_node.node.membership.reach`) over the memory
network, whose fabric routes calls to a slot through its relay and counts what the relay carries.

- Half a fleet behind NAT learns bit for bit what the same fleet learns on one LAN, its NATed nodes sending and
  fusing; nobody is suspected; the results say who relayed whom and what it cost.
- A relay killed mid-run: its relayed nodes take slots on other members, and no round is lost or fused twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dfl_node.node.membership.reach import RECHECK_S
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.simulation import DeviceClass, FaultSchedule, KillFault
from dfl_node.sim.experiment import run_fleet

LAN = ExperimentConfig(nodes=8, partition="iid", seed=3, rounds=20, eval_every=10, batch_size=20, mkt_batch_size=20,
                       lr=0.05, hidden=[32, 32])
BEHIND_NAT = 4  # the first four nodes (device classes take the nodes in order)


def with_nat(config: ExperimentConfig, **simulation: object) -> ExperimentConfig:
    devices = {"home": DeviceClass(nodes=BEHIND_NAT, nat=True)}
    return config.model_copy(update={"simulation": config.simulation.model_copy(
        update={"devices": devices, **simulation})})


def test_half_a_fleet_behind_nat_learns_bit_for_bit_as_on_one_lan(tmp_path: Path) -> None:
    lan = run_fleet(LAN, "defkt", tmp_path / "lan")
    nat = run_fleet(with_nat(LAN), "defkt", tmp_path / "nat")
    assert [n.param_sha256 for n in nat.nodes] == [n.param_sha256 for n in lan.nodes]
    assert nat.rounds == lan.rounds == LAN.rounds
    relayed = nat.nodes[:BEHIND_NAT]
    assert all(n.reachability == "relayed" and n.relay for n in relayed), [(n.id, n.reachability) for n in relayed]
    assert {n.reachability for n in nat.nodes[BEHIND_NAT:]} == {"direct"}
    assert sum(n.models_sent for n in relayed) > 0 and sum(n.models_received for n in relayed) > 0
    assert nat.relays is not None and lan.relays is None
    assert nat.relays["nodes_relayed"] == BEHIND_NAT and nat.relays["relays"] >= 2  # spread by rendezvous hashing
    assert nat.relays["bytes_relayed"] >= sum(n.models_received for n in relayed) * 10_000  # models crossed them
    assert nat.relays["unreachable"] == 0
    assert nat.membership is not None and nat.membership["false_suspicions"] == 0


def test_a_relay_killed_mid_run_is_replaced_and_no_round_is_lost_or_fused_twice(tmp_path: Path) -> None:
    first = run_fleet(with_nat(LAN), "defkt", tmp_path / "first")
    relays = sorted({n.relay for n in first.nodes if n.relay})
    victim = relays[0]  # a relay, killed after the fleet settled, back a minute later (its slots long given up)
    faults = FaultSchedule(kills=[KillFault(at=20.0, node=victim, down_for=60.0)])
    run = run_fleet(with_nat(LAN, faults=faults), "defkt", tmp_path / "killed", heartbeat=1.0, peer_timeout=4.0)
    assert run.faults is not None
    assert run.faults["kills"] == 1 and run.faults["rounds_completed"] == LAN.rounds, run.faults
    assert run.faults["rounds_lost"] == 0 and run.faults["rounds_run_twice"] == 0, run.faults
    assert run.faults["accepted_models_lost"] == 0, run.faults
    assert all(n.reachability == "relayed" and n.relay for n in run.nodes[:BEHIND_NAT])
    assert run.relays is not None and run.relays["unreachable"] == 0


@pytest.mark.timeout(60, method="thread")  # the spin was a hang (the loop swallows a signal's exception)
def test_relayed_nodes_recheck_their_reachability_and_the_fleet_goes_on_past_it(tmp_path: Path) -> None:
    """Every RECHECK_S a relayed node asks again whether peers can dial it, then holds its slot until the next.
    asyncio runs a timer that falls within its clock's resolution early, and Reach's loop, reading a clock a hair
    before the recheck's time, held its slot for no time again and again: the fleet stood still at 302 s."""
    duration = RECHECK_S + 30.0
    run = run_fleet(with_nat(LAN), "defkt", tmp_path, mode="async", duration=duration, interval=60.0,
                    participation=1.0)
    assert run.wall_time_s >= duration
    assert all(n.reachability == "relayed" and n.relay for n in run.nodes[:BEHIND_NAT])  # the recheck kept them so
    assert run.rounds > 0 and run.relays is not None and run.relays["unreachable"] == 0
    assert run.membership is not None and run.membership["false_suspicions"] == 0
