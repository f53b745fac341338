"""What a peer can make a node keep or write: refusals counted durably, logs rate-limited,
garbage requests refused without a traceback, a bounded history, a bounded peer table."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dfl_node import PROTOCOL_VERSION
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.node.node import Node
from dfl_node.peering.messages import MAX_UPDATES
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.launcher import free_port
from tests.helpers.fleet import fleet_node_config
from tests.helpers.waiting import until


def config_for(shards: Path, state: Path, **settings: object) -> NodeConfig:
    base = dict(id="node-0", data=shards / "node-0", grpc_port=free_port(), http_port=0, mdns=False,
                swarm=f"bounds-{uuid.uuid4().hex[:6]}", state_dir=state, evaluate=False, mode="async",
                interval=3600.0)  # no exchanges: these tests watch the node itself
    return fleet_node_config(**{**base, **settings})


class Running:
    def __init__(self, config: NodeConfig) -> None:
        self.daemon = Daemon.build(config)
        self.node = self.daemon.node
        self.stop = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{config.network.grpc_port}")
        self.stub = pb_grpc.DflNodeStub(self.channel)

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(run_node(self.daemon, self.stop))
        await self.node.ready.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        self.stop.set()
        await self.task


@pytest.fixture
async def running(fleet_shards: Path, tmp_path: Path) -> AsyncIterator[Running]:
    async with Running(config_for(fleet_shards, tmp_path / "state")) as r:
        yield r


def hello(node: Node, **changes: object) -> pb.HelloRequest:
    fields = dict(protocol_version=PROTOCOL_VERSION, swarm=node.config.swarm, node_id="stranger",
                  fingerprint=node.identity.fingerprint, algorithm=node.config.algorithm, grpc_address="127.0.0.1:1",
                  boot_id="b", model=node.identity.model)
    return pb.HelloRequest(**{**fields, **changes})


async def test_rejection_counts_survive_a_restart(fleet_shards: Path, tmp_path: Path) -> None:
    config = config_for(fleet_shards, tmp_path / "state")
    async with Running(config) as r:
        for _ in range(3):
            await r.stub.Hello(hello(r.node, swarm="elsewhere"), timeout=5)
        assert r.node.tally.rejected == {"swarm_mismatch": 3}
    async with Running(config.model_copy(update={"grpc_port": free_port()})) as again:
        assert again.node.tally.rejected == {"swarm_mismatch": 3}


async def test_history_and_state_file_are_bounded(fleet_shards: Path, tmp_path: Path) -> None:
    config = config_for(fleet_shards, tmp_path / "state", history_limit=5)
    async with Running(config) as r:
        for i in range(12):
            await r.node.learner.changed("eval", i, None)
        assert [h.round for h in r.node.history()] == list(range(7, 12))
        saved = json.loads((tmp_path / "state" / "state.json").read_text())
        assert [h["round"] for h in saved["history"]] == list(range(7, 12))
    async with Running(config.model_copy(update={"grpc_port": free_port()})) as again:
        await again.node.learner.changed("eval", 12, None)
        assert [h.round for h in again.node.history()] == list(range(8, 13))  # still bounded after a restart


@pytest.mark.parametrize("method", ["Hello", "Assign", "PassToken", "Probe", "Pull", "Ping"])
async def test_an_undecodable_request_is_refused_and_counted_without_a_traceback(
        running: Running, method: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    kind = running.channel.unary_stream if method == "Pull" else running.channel.unary_unary
    call = kind(f"/dfl.v1.DflNode/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        response = call(b"\xff\xff\xff\x07garbage", timeout=5)
        if method == "Pull":
            async for _ in response:
                pass
        else:
            await response
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert running.node.tally.rejected == {"undecodable": 1}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert (await running.stub.Hello(hello(running.node), timeout=5)).accepted  # still serving


async def test_a_ping_with_too_many_updates_is_refused_and_counted(running: Running) -> None:
    """A membership ping may carry 16 updates (MAX_UPDATES): one with more is refused before it is converted, and
    the node goes on answering pings."""
    update = pb.MemberUpdate(state="suspect", incarnation=1, node_id="node-9", sender="x")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.Ping(pb.MembershipPing(sender="x", updates=[update] * (MAX_UPDATES + 1)), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert running.node.tally.rejected == {"too_many_updates": 1}
    assert (await running.stub.Ping(pb.MembershipPing(sender="x", updates=[update]), timeout=5)).ok


async def test_refusals_are_counted_in_full_but_logged_at_a_bounded_rate(
        running: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    await asyncio.gather(*(running.stub.Hello(hello(running.node, swarm="elsewhere"), timeout=5) for _ in range(200)))
    assert running.node.tally.rejected == {"swarm_mismatch": 200}
    lines = [r for r in caplog.records if "swarm_mismatch" in r.getMessage()]
    assert 1 <= len(lines) <= 2, len(lines)


async def test_a_hello_flood_of_fake_peers_leaves_a_bounded_table(fleet_shards: Path, tmp_path: Path) -> None:
    """300 Hellos from peers that do not exist: before, each became a peer for ever (heartbeated, with a
    channel of its own); now at most ``max_pending_peers`` wait for confirmation, and they are dropped."""
    # pending for peer_timeout: longer than the flood takes on a loaded machine (else some are pruned during it)
    config = config_for(fleet_shards, tmp_path / "state", heartbeat=0.2, peer_timeout=5.0, max_pending_peers=8)
    async with Running(config) as r:
        node = r.node
        fakes = [hello(node, node_id=f"fake-{i}", grpc_address=f"127.0.0.1:{1 + i % 3}", boot_id=f"b{i}")
                 for i in range(300)]
        replies = await asyncio.gather(*(r.stub.Hello(h, timeout=5) for h in fakes))
        assert all(rep.accepted for rep in replies)  # compatible: the table is what has no room
        assert len(node.membership.table.pending) <= 8 and not node.membership.table.peers
        assert node.tally.rejected["peer_table_full"] == 300 - 8
        assert len(node.network.clients) <= 3  # one channel per probed address, not per fake
        await until(lambda: not node.membership.table.pending and not node.network.clients, 15,  # type: ignore[attr-defined]
                    "the unconfirmed peers and their channels to go")
        assert not node.membership.table.peers
        assert not node.membership.table.alive_ids()


async def test_a_dead_peer_is_forgotten_after_the_expiry(fleet_shards: Path, tmp_path: Path) -> None:
    first = config_for(fleet_shards, tmp_path / "a", heartbeat=0.2, peer_timeout=0.6, peer_expiry=1.5)
    second = config_for(fleet_shards, tmp_path / "b", id="node-1", data=fleet_shards / "node-1", swarm=first.swarm,
                        peers=[f"127.0.0.1:{first.network.grpc_port}"])
    async with Running(first) as a:
        async with Running(second):
            # it said Hello and answered ours
            await until(lambda: a.node.membership.alive_ids() == ["node-1"], 5, "node-1 to be alive")
        await until(lambda: "node-1" not in a.node.membership.table.peers, 6, "node-1 to be forgotten")
        assert f"127.0.0.1:{second.network.grpc_port}" not in a.node.network.clients  # type: ignore[attr-defined]
