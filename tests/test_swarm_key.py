"""The swarm key (issue 13): the lighter authentication of :mod:`dfl_node.net.psk`, on in-process nodes over real gRPC.

- A peer without the key, or with another one, is refused at Hello and counted, and never enters the peer table;
  on a connection that has not authenticated, nothing else is served (refused and counted), nor anything in
  another node's name; a replayed Hello is refused.
- A relay of another node's answers (which prove the key, for an address we did not dial) is refused.
- A key holder is never refused as unauthenticated: it says Hello first whenever its peer would refuse it.

Credentials, mutual TLS and authenticated fleets against the simulator: ``tests/test_auth.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from dfl_node import PROTOCOL_VERSION
from dfl_node.net import psk
from dfl_node.net.certs import new_secret
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.peering.errors import AUTH_REQUIRED
from dfl_node.peering.probes import ProbeRequest
from dfl_node.service.run import announcement
from dfl_node.testbed.launcher import free_port
from tests.test_auth import hello_from, until
from tests.test_startup_errors import node_config, running


async def _signed_hello(stub: pb_grpc.DflNodeStub, key: bytes, request: pb.HelloRequest) -> pb.HelloRequest:
    """The challenge–response on ``stub``'s connection; returns the Hello that authenticated it."""
    first = psk.sign_request(key, request, None)
    reply = await stub.Hello(first, timeout=5)
    assert reply.reason == AUTH_REQUIRED
    psk.check_reply(key, first, reply)
    signed = psk.sign_request(key, request, reply.auth_nonce)
    reply = await stub.Hello(signed, timeout=5)
    psk.check_reply(key, signed, reply)
    assert reply.accepted, reply.reason
    return signed


async def test_swarm_key_keyless_and_wrong_key_peers_are_refused_and_only_authenticated_connections_served(
        fleet_shards: Path, tmp_path: Path) -> None:
    key, other = new_secret(tmp_path / "swarm.key"), new_secret(tmp_path / "other.key")

    def config(node_id: str, peers: list[str], port: int, key_file: Path | None):  # noqa: ANN202
        return node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id, grpc_port=port,
                           swarm_key_file=key_file, peers=peers, mode="async", interval=3600)

    ports = [free_port() for _ in range(4)]
    a, b, c, d = (f"127.0.0.1:{p}" for p in ports)
    async with running(config("node-0", [b, c, d], ports[0], key)) as node0, \
            running(config("node-1", [a], ports[1], key)) as node1, \
            running(config("node-2", [a], ports[2], other)) as wrong_key, \
            running(config("node-3", [a], ports[3], None)):  # keyless
        await until(lambda: node0.membership.alive_ids() == ["node-1"] and node1.membership.alive_ids() == ["node-0"])
        rejected = node0.tally.rejected
        await until(lambda: rejected["auth_failed"] >= 3 and rejected["unauthenticated"] >= 6)
        # it cannot check ours either
        assert not wrong_key.membership.table.peers and wrong_key.tally.rejected["auth_failed"] >= 3
        assert set(node0.membership.table.peers) == {"node-1"} and not node0.membership.table.pending
        assert node0.status().authentication == "psk" and "auth_required" not in rejected

        swarm_key = psk.read_swarm_key(key)
        stranger = hello_from(node0, node_id="node-9", grpc_address="127.0.0.1:9")
        async with grpc.aio.insecure_channel(a, options=[("grpc.use_local_subchannel_pool", 1)]) as channel, \
                grpc.aio.insecure_channel(a, options=[("grpc.use_local_subchannel_pool", 1)]) as other_channel:
            stub, unauthenticated = pb_grpc.DflNodeStub(channel), pb_grpc.DflNodeStub(other_channel)
            signed = await _signed_hello(stub, swarm_key, stranger)
            before = dict(rejected)
            # this connection proved the key as node-9: its probe reaches the node (which is not selecting)
            answer = await stub.Probe(pb.ProbeRequest(sender="node-9", swarm=node0.config.swarm), timeout=5)
            assert (answer.ok, answer.reason) == (False, "not_selecting")
            with pytest.raises(grpc.aio.AioRpcError) as denied:  # …but only in its own name
                await stub.Probe(pb.ProbeRequest(sender="node-1", swarm=node0.config.swarm), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # another connection that said no Hello: nothing is served on it
            for call in (unauthenticated.Assign(pb.RoundAssignment(round=0, role="sender"), timeout=5),
                         unauthenticated.PassToken(pb.RoundToken(round=0, holder="node-0"), timeout=5),
                         unauthenticated.Probe(pb.ProbeRequest(sender="node-9"), timeout=5)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            frames = [pb.Frame(header=pb.TransferHeader(protocol_version=PROTOCOL_VERSION, sender="node-9",
                                                        swarm=node0.config.swarm))]
            verdicts = [f async for f in unauthenticated.Transfer(iter(frames), timeout=5)]
            assert verdicts[0].result.reason == "unauthenticated"
            pulled = [f async for f in unauthenticated.Pull(pb.PullRequest(aggregator="node-9"), timeout=5)]
            assert pulled[0].result.reason == "unauthenticated"
            # a captured Hello, replayed (here even on the connection it came from): refused
            replayed = await unauthenticated.Hello(signed, timeout=5)
            assert (replayed.accepted, replayed.reason) == (False, "auth_replay")
        delta = {k: rejected[k] - before.get(k, 0) for k in rejected if rejected[k] != before.get(k, 0)}
        assert delta.get("identity_mismatch") == 1 and delta.get("auth_replay") == 1
        assert delta.get("unauthenticated", 0) >= 5  # the five calls (and the keyless node's Hellos meanwhile)
        secret = swarm_key.decode()
        assert not any(secret in v for v in announcement(node0).to_txt().values())
        assert secret not in repr(node0.network.security) and secret not in node0.status().model_dump_json()


async def test_the_relay_of_another_nodes_answers_is_refused(fleet_shards: Path, tmp_path: Path) -> None:
    """A host without the key that makes us dial it (an mDNS announcement) and passes our Hellos to a real
    node, and its answers back: the answers prove the key, but for another address than the one we dialed."""
    key = new_secret(tmp_path / "swarm.key")
    ports = [node_config(fleet_shards, tmp_path).network.grpc_port for _ in range(2)]

    class Relay(pb_grpc.DflNodeServicer):
        def __init__(self, target: str) -> None:
            self.channel = grpc.aio.insecure_channel(target)

        async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
            return await pb_grpc.DflNodeStub(self.channel).Hello(request, timeout=5)

    def config(node_id: str, port: int):  # noqa: ANN202
        return node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id, grpc_port=port,
                           swarm_key_file=key, mode="async", interval=3600)

    async with running(config("node-0", ports[0])) as node0, running(config("node-1", ports[1])) as node1:
        relay = grpc.aio.server()
        servicer = Relay(node0.address)
        pb_grpc.add_DflNodeServicer_to_server(servicer, relay)
        relayed = f"127.0.0.2:{relay.add_insecure_port('127.0.0.2:0')}"
        await relay.start()
        try:
            # node-1 dials the relay as if it were a peer
            assert await node1.membership.handshake.probe(relayed, 2.0) is None
        finally:
            await relay.stop(None)
            await servicer.channel.close()
        assert node1.tally.rejected["address_mismatch"] == 1
        assert relayed not in {p.address for p in node1.membership.table.peers.values()}


async def test_a_key_holder_is_never_refused_as_unauthenticated(fleet_shards: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer counts a call on a connection that did not authenticate as an intruder's. A node authenticates
    before its call whenever that would happen: its peer was not up yet when it called (the Hello waits for
    the connection, as the call does), the peer restarted since (a new connection), or its session at the peer
    is about to expire — only its own Hellos renew it, and node-1 sends none to node-0, which says Hello to it."""
    monkeypatch.setattr(psk, "SESSION_TTL_S", 2.0)
    key = new_secret(tmp_path / "swarm.key")
    port = free_port()

    def config(node_id: str, grpc_port: int, **changes: object):  # noqa: ANN202
        return node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id,
                           grpc_port=grpc_port, swarm_key_file=key, mode="async", interval=3600, **changes)

    # node-1's heartbeat: no Hello of its own while this test runs, however late node-0's come
    async with running(config("node-1", free_port(), heartbeat=60)) as node1:
        client = node1.network.link(f"127.0.0.1:{port}")

        async def probed() -> None:
            answer = await client.probe(ProbeRequest(sender="node-1", swarm=node1.config.swarm), timeout=30)
            assert (answer.ok, answer.reason) == (False, "not_selecting")  # served: node-0 is not selecting

        calling = asyncio.create_task(probed())  # nothing listens there yet
        async with running(config("node-0", port)) as node0:
            await calling
            await until(lambda: node0.membership.table.alive_ids() == ["node-1"])
            await asyncio.sleep(psk.SESSION_TTL_S)  # node-1's session at node-0 expires meanwhile
            await probed()
            assert node0.tally.rejected["unauthenticated"] == 0
        async with running(config("node-0", port)) as restarted:
            await probed()
            assert restarted.tally.rejected["unauthenticated"] == 0
