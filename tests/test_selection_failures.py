"""Peer selection's failure cases: a selection candidate that never answers its probe (the daemon's own nodes on the
in-memory network and the virtual clock), and a pull source that dies mid-stream (real daemons: a gRPC stream
that breaks). Each must leave the fleet running.

The misbehaving peer is ``tests/fake_peer.py``: compatible at Hello (so the nodes plan with it), refusing every
role, silent to probes, and dying in the middle of the model it is pulled for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file

from dfl_node.algorithms import NodeProfile, make_algorithm
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.sim.clock import run_virtual
from dfl_node.sim.fleet import BASE_PORT
from dfl_node.testbed.launcher import NodeProcess, Placement, free_port, plan_fleet, stop_all, wait_until
from tests.fake_peer import FakeNode
from tests.helpers.fleet import FLEET, virtual_fleet

pytestmark = pytest.mark.slow
FAKE = "node-3"  # sorts after the real node-0..node-2


@contextlib.contextmanager
def fake_peer(swarm: str, algorithm: str) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_peer", str(port), FAKE, swarm, algorithm, "mlp:32,32",
                             "8", "10"], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc, f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _fleet_with(fake: str, shards: Path, workdir: Path, algorithm: str, swarm: str, count: int,
                **extra: object) -> list[NodeProcess]:
    """``count`` real daemons that know each other and the fake peer by address (no mDNS)."""
    config = FLEET.model_copy(update={"nodes": count})
    nodes = plan_fleet(config, algorithm, shards, workdir, [Placement("127.0.0.1")] * count, swarm=swarm,
                       mdns=False, static_peers=True, extra=extra)
    for node in nodes:
        node.env["DFL_PEERS"] = ",".join([*(f"127.0.0.1:{n.grpc_port}" for n in nodes if n is not node), fake])
    return nodes


def test_a_candidate_that_never_answers_its_probe_is_skipped_and_the_rounds_go_on(
        fleet_shards: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three of the daemon's own nodes and the fake, on the in-memory network and the virtual clock."""
    rounds = 8
    config = FLEET.model_copy(update={"nodes": 3})
    fake = FakeNode(FAKE, "default", "defkt-select", "mlp:32,32", 8, 10, BASE_PORT + 3)  # the fleet's swarm

    async def main() -> dict[str, dict]:
        async with virtual_fleet(config, "defkt-select", fleet_shards, tmp_path, others={fake.address: fake},
                                 min_peers=3, rounds=rounds, evaluate=False,
                                 probe_timeout=1.5,  # round 0 waits for the fake too
                                 round_timeout=4.0) as fleet:  # how long a group waits for what the fake refuses
            await fleet.finished()
            return {n: node.status().model_dump(mode="json") for n, node in sorted(fleet.nodes.items())}

    caplog.set_level(logging.INFO)
    statuses = run_virtual(main(), lambda work: work.steps * 0.01)
    algorithm = make_algorithm("defkt-select", FLEET.learning, FLEET.per_algorithm)
    members = [NodeProfile(i, "mlp:32,32", 1) for i in ("node-0", "node-1", "node-2", FAKE)]
    plans = [algorithm.plan_round(t, members, {}) for t in range(rounds)]
    asked = sum(FAKE in g.candidates for plan in plans for g in plan)
    chose = sum(FAKE not in g.senders for plan in plans for g in plan)  # rounds with a real sender
    refused = sum(FAKE in g.senders for plan in plans for g in plan)  # the fake refuses to send: planned around
    assert asked >= 1 and chose >= 1 and refused >= 1, "the seed must make the fake a candidate and a sender"
    for s in statuses.values():
        assert s["round"] == rounds and s["done"], s
    assert sum(s["probes_unanswered"] for s in statuses.values()) == asked  # each silent probe: skipped, counted
    # each group of the fake as sender failed group_attempts times and the round was planned again without it: the
    # real nodes played it, so every round had its fusion, and none was given up
    assert sum(s["groups_replanned"] for s in statuses.values()) == refused
    assert sum(s["groups_abandoned"] for s in statuses.values()) == 0
    assert sum(s["fusions"] for s in statuses.values()) == rounds
    assert "candidate node-3 skipped: deadline_exceeded" in caplog.text
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def _assign(address: str, assignment: pb.RoundAssignment) -> pb.Ack:
    async with grpc.aio.insecure_channel(address) as channel:
        return await pb_grpc.DflNodeStub(channel).Assign(assignment, timeout=60, wait_for_ready=True)


async def _pull_round(aggregator: NodeProcess, round_: int, sources: list[str],
                      fake: subprocess.Popen | None = None) -> tuple[pb.Ack, float]:
    """Play the token holder: the aggregator pulls from ``sources``; the fake is killed once it stalls."""
    started = time.monotonic()
    assignment = pb.RoundAssignment(round=round_, epoch=0, holder="test", role="aggregator", aggregator=aggregator.id,
                                    senders=sources, pull=True, deadline_s=60)
    pulling = asyncio.create_task(_assign(f"127.0.0.1:{aggregator.grpc_port}", assignment))
    if fake is not None:
        assert fake.stdout is not None
        assert await asyncio.to_thread(fake.stdout.readline) == "stalled\n"  # its model is half sent…
        fake.kill()  # …and it dies
    return await pulling, time.monotonic() - started


def test_a_pull_source_that_dies_mid_stream_is_left_out_and_the_node_goes_on(fleet_shards: Path,
                                                                              tmp_path: Path) -> None:
    swarm = f"pull-{uuid.uuid4().hex[:6]}"
    with fake_peer(swarm, "fairavg") as (fake, address):
        # min_peers above the fleet: no token ever starts, the test assigns the rounds (as a holder would)
        nodes = _fleet_with(address, fleet_shards, tmp_path, "fairavg", swarm, 2, min_peers=10)
        try:
            for node in nodes:
                node.start()
            wait_until(nodes, lambda s: all(v is not None and sum(p["alive"] for p in v["peers"]) == 2
                                            for v in s.values()), timeout=60)
            first, took = asyncio.run(_pull_round(nodes[0], 0, ["node-1", FAKE], fake))
            after_first = wait_until(nodes, lambda s: all(v["role"] == "idle" for v in s.values()), timeout=30)
            second, _ = asyncio.run(_pull_round(nodes[0], 1, ["node-1"]))
            statuses = wait_until(nodes, lambda s: s["node-0"]["fusions"] == 2 and s["node-0"]["role"] == "idle",
                                  timeout=30)
        finally:
            stop_all(nodes)
    assert first.ok and second.ok, (first, second)
    assert took < 30  # the dead stream failed fast: nobody waited for the round's deadline
    aggregator = after_first["node-0"]
    assert aggregator["fusions"] == 1 and aggregator["models_received"] == 1 and aggregator["senders_abandoned"] == 1
    assert statuses["node-0"]["fusions"] == 2 and statuses["node-0"]["senders_abandoned"] == 1
    assert statuses["node-1"]["models_sent"] == 2
    state = load_file(str(nodes[0].state_dir / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in state.values())
