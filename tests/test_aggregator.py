"""An aggregator with several concurrent senders, one of which is SIGKILLed mid-stream (real daemons).

The test plays the token holder: it assigns a group of 3 senders to an aggregator daemon (FedAvg),
two of them real daemons and the third a process that dies halfway through its transfer. The
round must complete with the other two well within the group's deadline, every model must stay
consistent (finite, the senders hold exactly the aggregator's average), and the abandoned sender
must be counted in the aggregator's /status.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import torch
from safetensors.torch import load_file

from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.wire import SERVICE_NAME
from dfl_node.testbed.launcher import NodeProcess, Placement, plan_fleet, poll_status, stop_all, wait_until
from tests.helpers.fleet import FLEET
from tests.stalled_sender import first_frames, pack

pytestmark = pytest.mark.slow
DEADLINE_S = 60.0


async def _assign(address: str, assignment: pb.RoundAssignment) -> pb.Ack:
    async with grpc.aio.insecure_channel(address) as channel:
        return await pb_grpc.DflNodeStub(channel).Assign(assignment, timeout=DEADLINE_S, wait_for_ready=True)


@contextlib.asynccontextmanager
async def _stalled_sender(address: str, swarm: str) -> AsyncIterator[subprocess.Popen]:
    """``stalled_sender.py`` pushing to ``address`` as node-3: its stream open, half sent, until killed."""
    frames = pack(first_frames("node-3", swarm, "mlp:32,32", 8, 10))
    victim = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stalled_sender.py")), address,
                               f"/{SERVICE_NAME}/Transfer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        victim.stdin.write(frames)
        victim.stdin.close()
        assert await asyncio.to_thread(victim.stdout.readline) == b"stalled\n"
        yield victim
    finally:
        victim.kill()
        victim.wait()


async def _play_the_round(nodes: list[NodeProcess], swarm: str) -> tuple[list[pb.Ack], float]:
    aggregator, senders = nodes[0], nodes[1:3]
    common = dict(round=0, epoch=0, holder="test", aggregator=aggregator.id,
                  aggregator_address=f"127.0.0.1:{aggregator.grpc_port}", deadline_s=DEADLINE_S,
                  senders=[n.id for n in senders] + ["node-3"])
    ack = await _assign(common["aggregator_address"], pb.RoundAssignment(role="aggregator", **common))
    assert ack.ok, ack
    async with _stalled_sender(common["aggregator_address"], swarm) as victim:  # its stream is open, half sent
        started = time.monotonic()
        sending = [asyncio.create_task(_assign(f"127.0.0.1:{n.grpc_port}", pb.RoundAssignment(role="sender", **common)))
                   for n in senders]
        victim.kill()  # while the real senders train and stream
        acks = await asyncio.gather(*sending)
        return acks, time.monotonic() - started


def test_a_sender_killed_mid_stream_is_left_out_and_the_round_completes(fleet_shards: Path, tmp_path: Path) -> None:
    swarm = f"agg-{uuid.uuid4().hex[:6]}"
    nodes = plan_fleet(FLEET.model_copy(update={"nodes": 3}), "fedavg", fleet_shards, tmp_path,
                       [Placement("127.0.0.1")] * 3, swarm=swarm, mdns=False, extra={"min_peers": 1})
    try:
        for node in nodes:
            node.start()
        wait_until(nodes, lambda s: all(v is not None for v in s.values()), timeout=60)
        acks, took = asyncio.run(_play_the_round(nodes, swarm))
        statuses = wait_until(nodes, lambda s: all(v["role"] == "idle" for v in s.values()), timeout=30)
    finally:
        stop_all(nodes)
    assert all(a.ok for a in acks), acks  # both real senders' transfers were taken…
    assert took < DEADLINE_S / 2  # …and the group did not wait for the dead one's deadline
    aggregator, senders = statuses["node-0"], [statuses["node-1"], statuses["node-2"]]
    assert aggregator["senders_abandoned"] == 1 and aggregator["fusions"] == 1 and aggregator["models_received"] == 2
    assert all(s["models_sent"] == 1 and s["models_received"] == 0 for s in senders)  # a reply is not a model received
    # FedAvg: every member holds the average
    assert {s["param_sha256"] for s in senders} == {aggregator["param_sha256"]}
    for node in nodes:
        state = load_file(str(node.state_dir / "model.safetensors"))
        assert all(torch.isfinite(t).all() for t in state.values()), node.id
    assert aggregator["rejected"] == {"truncated": 1}  # the dead stream ended halfway (its sender: abandoned)


async def _a_half_open_stream(aggregator: NodeProcess, swarm: str) -> tuple[pb.Ack, float]:
    """The aggregator's only sender sends a header and a few chunks, then nothing — its process alive,
    its TCP connection open (such a stream once held the receiver role for good). Returns the ack
    of the aggregator role taken afterwards and how long the node was held."""
    common = dict(round=0, epoch=0, holder="test", aggregator=aggregator.id,
                  aggregator_address=f"127.0.0.1:{aggregator.grpc_port}", deadline_s=DEADLINE_S, senders=["node-3"])
    ack = await _assign(common["aggregator_address"], pb.RoundAssignment(role="aggregator", **common))
    assert ack.ok, ack
    async with _stalled_sender(common["aggregator_address"], swarm) as victim:
        started = time.monotonic()
        again = {**common, "round": 1, "senders": ["node-1"]}  # the next group: refused while the stream holds the role
        while (ack := await _assign(common["aggregator_address"],
                                    pb.RoundAssignment(role="aggregator", **again))).reason == "busy":
            assert victim.poll() is None  # the stream is still open: only the node's own deadline can free it
            await asyncio.sleep(0.2)
        return ack, time.monotonic() - started


def test_a_half_open_stream_is_dropped_after_the_stream_timeout(fleet_shards: Path, tmp_path: Path) -> None:
    swarm = f"agg-{uuid.uuid4().hex[:6]}"
    nodes = plan_fleet(FLEET.model_copy(update={"nodes": 2}), "fedavg", fleet_shards, tmp_path,
                       [Placement("127.0.0.1")] * 2, swarm=swarm, mdns=False,
                       extra={"min_peers": 1, "stream_timeout": 1.0})
    try:
        nodes[0].start()
        wait_until(nodes[:1], lambda s: all(v is not None for v in s.values()), timeout=60)
        ack, held = asyncio.run(_a_half_open_stream(nodes[0], swarm))
        status = poll_status(nodes[:1])["node-0"]
    finally:
        stop_all(nodes[:1])
    assert ack.ok, ack  # the node took the next role: the silent stream no longer holds it
    assert 1.0 <= held < DEADLINE_S / 2  # freed by --stream-timeout (1 s), long before the group's deadline
    assert status["rejected"] == {"idle_timeout": 1} and status["senders_abandoned"] == 1


def test_a_node_stopped_while_it_waits_for_its_senders_stops_at_once(fleet_shards: Path, tmp_path: Path) -> None:
    """SIGTERM while the node's group waits for a sender that never sends: once the node stops serving, nothing more
    can arrive, so it stops waiting then — not at the group's deadline (``round_timeout``, 120 s by default: past
    ``docker stop``'s 10 s and systemd's 90 s, a graceful stop would have become a kill)."""
    nodes = plan_fleet(FLEET.model_copy(update={"nodes": 2}), "fedavg", fleet_shards, tmp_path,
                       [Placement("127.0.0.1")] * 2, swarm=f"agg-{uuid.uuid4().hex[:6]}", mdns=False,
                       extra={"min_peers": 1})
    aggregator = nodes[0]
    try:
        aggregator.start()
        wait_until([aggregator], lambda s: all(v is not None for v in s.values()), timeout=60)
        common = dict(round=0, epoch=0, holder="test", aggregator=aggregator.id, deadline_s=DEADLINE_S,
                      aggregator_address=f"127.0.0.1:{aggregator.grpc_port}", senders=["node-3"])
        ack = asyncio.run(_assign(common["aggregator_address"], pb.RoundAssignment(role="aggregator", **common)))
        assert ack.ok, ack
        assert poll_status([aggregator])[aggregator.id]["role"] == "aggregator"  # waiting for node-3
        asked = time.monotonic()
        aggregator.terminate()
        code = aggregator.process.wait(DEADLINE_S)
        took = time.monotonic() - asked
    finally:
        stop_all([aggregator])
    assert code == 0 and took < DEADLINE_S / 4, (code, took)
    assert "stopped at round" in aggregator.log_path.read_text()
