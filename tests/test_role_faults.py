"""A node's roles under the faults a fleet once met: real :class:`Node` objects, real gRPC servers on loopback.

* A round played again ends as an unfailed one would: a role that does not complete puts the node's
  models back (an aggregator's own local training, a sender's training in place), so the replay starts
  where the first try started. A CI run of ``test_testbed_equals_simulator[fairavg]`` differed from the
  simulator by 0.07 because a puller trained twice.
* The holder's address book: a pull source only the holder has confirmed yet is still pulled (that
  CI run's first try failed with ``Failed to create channel to ''``).
* An aggregator stops waiting for a sender that restarted (a new boot id) at once, not after its deadline.
* An Assign holds a role no longer than our ``round_timeout``, a round far ahead of the fleet is refused,
  and a sender whose aggregator accepts no connection gives its role back after ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch

from dfl_node.algorithms import Role
from dfl_node.net.server import start_server
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.node import Node
from dfl_node.peering.messages import Assignment as WireAssignment
from dfl_node.peering.messages import HelloReply, Progress
from tests.helpers.fleet import daemon
from tests.helpers.nodes import order


def make_node(shards: Path, state: Path, node_id: str, algorithm: str, **settings: object) -> Node:
    return daemon(id=node_id, data=shards / node_id, algorithm=algorithm, http_port=0, mdns=False,
                  state_dir=state / node_id, evaluate=False, **settings).node


@contextlib.asynccontextmanager
async def serving(node: Node) -> AsyncIterator[str]:
    """``node``'s real gRPC server on a free loopback port; yields its address."""
    wire = node.network.wire  # type: ignore[attr-defined]  # a daemon's: gRPC
    server, port = await start_server(node.requests, wire, 30.0, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def pull_order(aggregator: str, source: str, **extra: object) -> Assignment:
    return order(round=0, epoch=1, holder=aggregator, role=Role.AGGREGATOR.value, aggregator=aggregator,
                 senders=(source,), pull=True, **extra)


def know(node: Node, peer_id: str, address: str, boot_id: str = "boot-1") -> None:
    """``node``'s peer table confirms ``peer_id`` at ``address`` (as a reply to its Hello would)."""
    node.membership.table.seen(HelloReply(node_id=peer_id, grpc_address=address, boot_id=boot_id,
                                          model=node.identity.model, num_samples=1, algorithm=node.config.algorithm))


def weights(node: Node) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in node.learner.ctx.model.state_dict().items()}


@pytest.mark.asyncio
async def test_a_pull_played_again_ends_as_if_it_had_not_failed(fleet_shards: Path, tmp_path: Path) -> None:
    """002's puller trains in place before it pulls. Its first try fails (the source is unknown to it), the
    round is played again: the result must equal a puller's that succeeded at once."""
    source = make_node(fleet_shards, tmp_path, "node-0", "fairavg")
    failed = make_node(fleet_shards, tmp_path / "a", "node-1", "fairavg")
    unfailed = make_node(fleet_shards, tmp_path / "b", "node-1", "fairavg")
    before = weights(failed)
    async with serving(source) as address:
        first = await failed.roles.play(pull_order("node-1", "node-0"))
        assert (first.ok, first.reason) == (False, "not_fused")
        after_failure = weights(failed)
        assert all(torch.equal(before[k], after_failure[k]) for k in before), "the failed role left its training"
        for puller in (failed, unfailed):
            know(puller, "node-0", address)
            assert (await puller.roles.play(pull_order("node-1", "node-0"))).ok
    replayed, once = weights(failed), weights(unfailed)
    assert any(not torch.equal(before[k], once[k]) for k in before)  # the fusion changed the model
    assert all(torch.equal(replayed[k], once[k]) for k in once)


@pytest.mark.asyncio
async def test_a_sender_whose_transfer_failed_keeps_its_model(fleet_shards: Path, tmp_path: Path) -> None:
    """Combo trains its sender's model in place; a push that fails must not leave that training behind."""
    sender = make_node(fleet_shards, tmp_path, "node-0", "combo")
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    before = weights(sender)
    ack = await sender.roles.play(order(round=0, epoch=1, holder="node-0", role=Role.SENDER.value,
                                       aggregator="node-1", aggregator_address=address, senders=("node-0",)))
    assert (ack.ok, ack.reason) == (False, "not_fused")
    after = weights(sender)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert sender.roles.role is Role.IDLE


@pytest.mark.asyncio
async def test_a_pull_source_known_only_to_the_holder_is_pulled(fleet_shards: Path, tmp_path: Path) -> None:
    source = make_node(fleet_shards, tmp_path, "node-0", "gossip")
    puller = make_node(fleet_shards, tmp_path, "node-1", "gossip")
    async with serving(source) as address:
        assert puller.membership.address_of("node-0") is None  # its own table has not confirmed the source yet
        ack = await puller.roles.play(pull_order("node-1", "node-0", addresses={"node-0": address}))
    assert ack.ok, ack.reason
    assert puller.tally.counters["fusions"] == 1 and source.tally.counters["models_sent"] == 1


@contextlib.contextmanager
def silent_listener() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word (no HTTP/2 settings): to gRPC, a peer whose
    connection never becomes ready."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.asyncio
async def test_a_sender_gives_its_role_back_when_its_aggregator_accepts_no_connection(fleet_shards: Path,
                                                                                      tmp_path: Path) -> None:
    """It held the sender role for the whole round_timeout (120 s) before DEADLINE_EXCEEDED."""
    sender = make_node(fleet_shards, tmp_path, "node-0", "defkt", connect_timeout=1.0, round_timeout=60.0,
                       mode="async")
    with silent_listener() as address:
        started = time.monotonic()
        ack = await asyncio.wait_for(sender.requests.assign(WireAssignment(
            round=0, epoch=0, holder="node-1", role=Role.SENDER.value, aggregator="node-1",
            aggregator_address=address, senders=("node-0",))), timeout=20)
        await asyncio.wait_for(sender.roles.quiesce(), timeout=20)
        held = time.monotonic() - started
    assert (ack.ok, ack.reason) == (False, "transfer_failed")
    assert held < 10, f"held the sender role {held:.1f} s"


@pytest.mark.asyncio
async def test_an_assign_holds_the_aggregator_role_no_longer_than_our_max_round_timeout(fleet_shards: Path,
                                                                                        tmp_path: Path) -> None:
    """One Assign with a sender that never comes and deadline_s=40 held the only role 40 s. A holder may ask for a
    long deadline (its members are slow), but never longer than this node's own bound."""
    node = make_node(fleet_shards, tmp_path, "node-0", "defkt", round_timeout=1.0, max_round_timeout=2.0,
                     mode="async")
    started = time.monotonic()
    ack = await node.requests.assign(WireAssignment(round=0, epoch=0, holder="node-9", role=Role.AGGREGATOR.value,
                                                aggregator="node-0", senders=("node-9",), deadline_s=1000))
    assert ack.ok
    await asyncio.wait_for(node.roles.quiesce(), timeout=20)
    assert time.monotonic() - started < 5
    assert node.tally.counters["fusions"] == 0


@pytest.mark.asyncio
async def test_an_assign_far_ahead_of_the_fleet_is_refused_and_counted(fleet_shards: Path, tmp_path: Path) -> None:
    node = make_node(fleet_shards, tmp_path, "node-0", "defkt", round_window=100)
    know(node, "node-1", "127.0.0.1:1")
    node.membership.table.peers["node-1"].progress = Progress(round=500, epoch=1)
    forged = WireAssignment(round=2**63, epoch=1, holder="node-9", role=Role.AGGREGATOR.value, aggregator="node-0",
                        senders=("node-9",), deadline_s=1)
    ack = await node.requests.assign(forged)
    assert (ack.ok, ack.reason) == (False, "round_window")
    assert node.tally.rejected["round_window"] == 1 and node.roles.role is Role.IDLE
    honest = WireAssignment(round=600, epoch=1, holder="node-1", role=Role.AGGREGATOR.value, aggregator="node-0",
                        senders=("node-1",), deadline_s=0.2)
    assert (await node.requests.assign(honest)).reason != "round_window"  # within 100 of the fleet's round 500
    await asyncio.wait_for(node.roles.quiesce(), timeout=20)


@pytest.mark.asyncio
async def test_an_aggregator_stops_waiting_for_a_sender_that_restarted(fleet_shards: Path, tmp_path: Path) -> None:
    """A sender killed and restarted faster than peer_timeout was never seen to leave: its aggregator waited
    its whole round_timeout (a 130 s stall). Its new boot id says the old incarnation will not send."""
    node = make_node(fleet_shards, tmp_path, "node-0", "defkt", round_timeout=60.0)
    know(node, "node-1", "127.0.0.1:1", boot_id="before")
    ack = await node.roles.play(order(round=0, epoch=1, holder="node-1", role=Role.AGGREGATOR.value,
                                     aggregator="node-0", senders=("node-1",)))
    assert ack.ok and node.roles.collector is not None and node.roles.collector.missing() == {"node-1"}
    started = time.monotonic()
    know(node, "node-1", "127.0.0.1:1", boot_id="after")  # it answers a Hello again, as a new incarnation
    await asyncio.wait_for(node.roles.quiesce(), timeout=20)
    assert time.monotonic() - started < 2
    assert node.tally.counters["fusions"] == 0 and node.tally.counters["senders_abandoned"] == 1
