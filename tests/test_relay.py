"""Relays: nodes that peers cannot dial are reached through a member that peers can, on loopback.

- Four daemons under the swarm key or mutual TLS, two of them relayed (``--relay``, each by another relay), learn bit
  for bit as the simulator's fleet on one LAN does: every Hello, probe, role, token and model of the relayed nodes
  crossed a relay, and two relayed nodes exchanged through both relays. Their status says so.
- What a relay sees of the bytes it carries is TLS records, end to end between the two nodes; a stranger with
  another swarm key (or none) can neither hold a slot nor reach the relayed node through it, and a guessed tunnel
  token gets nothing; the relayed node goes on serving.
- A relay's bounds: its slots, and ``--relay-bytes``, past which it gives its slots back.

Behind a real NAT (masquerade, no route in) and the relays a node finds itself: ``tests/test_nat_sites.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from safetensors.torch import load_file

from dfl_node.net import relay as relay_module
from dfl_node.net.auth import Security
from dfl_node.net.certs import new_secret
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.relay import MAGIC, TOKEN_BYTES, RelayServer, Tunnels, pump
from dfl_node.net.swarm_tls import read_swarm_keys, swarm_tls
from dfl_node.testbed.launcher import Placement, all_done, free_port, plan_fleet, wait_until
from tests.helpers.fleet import FLEET, running_daemons, simulated
from tests.helpers.nodes import quiet_node_config, running
from tests.helpers.waiting import until

RELAYED = {"node-1": 0, "node-3": 2}  # relayed node → the node that relays it (by index)
UNSERVED = "127.0.0.1:9"  # the discard port: nothing listens there


@pytest.mark.parametrize("security", ["swarm-key", "mtls"])
def test_relayed_nodes_learn_bit_for_bit_as_on_one_lan(fleet_shards: Path, pki: Path, tmp_path: Path,
                                                        security: str) -> None:
    config = FLEET.model_copy(update={"rounds": 10})
    key = new_secret(tmp_path / "swarm.key")
    nodes = plan_fleet(config, "defkt", fleet_shards, tmp_path, [Placement("127.0.0.1")] * config.nodes,
                       swarm=f"relay-{uuid.uuid4().hex[:8]}", mode="round", mdns=False, static_peers=True)
    address = {n.id: f"127.0.0.1:{n.grpc_port}" for n in nodes}

    def per_node(node_id: str) -> dict[str, object]:
        """Only the relays are static peers, and a relayed node advertises an address nobody serves (as one behind
        NAT is, to its peers): nothing reaches it but through its relay."""
        auth = {"tls_dir": pki / node_id} if security == "mtls" else {"swarm_key_file": key}
        peers = ",".join(a for n, a in address.items() if n not in RELAYED and n != node_id)
        relay = RELAYED.get(node_id)
        relayed = {"relay": address[nodes[relay].id], "advertise": UNSERVED} if relay is not None else {}
        return {**auth, "peers": peers, **relayed}

    def known_at_their_slots(statuses: dict[str, dict | None]) -> bool:
        """Every node knows each relayed node at its slot, relayed by its relay (gossip carries where it moved)."""
        if not all_done(statuses):
            return False
        return all(any(p["id"] == relayed and p["address"] == statuses[relayed]["grpc_address"]  # type: ignore[index]
                       and p["relay"] == nodes[relay].id for p in status["peers"])  # type: ignore[index]
                   for relayed, relay in RELAYED.items() for node_id, status in statuses.items() if node_id != relayed)

    with running_daemons(nodes, per_node=per_node):
        statuses = wait_until(nodes, known_at_their_slots, timeout=180)
    result, models = simulated(config, "defkt", tmp_path / "sim")
    expected = {n.id: n for n in result.nodes}
    for node in nodes:
        mine = load_file(str(node.state_dir / "model.safetensors"))
        assert max(float((mine[k] - models[node.id][k]).abs().max()) for k in mine) == 0.0, node.id
        assert statuses[node.id]["models_sent"] == expected[node.id].models_sent
        assert statuses[node.id]["rejected"] == {}, statuses[node.id]["rejected"]
    for relayed, relay in RELAYED.items():
        status, relay_id = statuses[relayed], nodes[relay].id
        assert (status["reachability"], status["relay"]) == ("relayed", relay_id)
        assert status["grpc_address"] not in (address[relayed], UNSERVED)  # its slot on the relay
        assert status["models_sent"] + status["models_received"] > 0  # it took part
        carried = statuses[relay_id]["relaying"]
        assert carried["slots"] == 1 and carried["connections"] > 0 and carried["bytes"] > 0
    assert {statuses[n]["reachability"] for n in ("node-0", "node-2")} == {"direct"}


def recording_pump(seen: list[tuple[bytearray, bytearray]]) -> Callable[..., None]:
    """:func:`~dfl_node.net.relay.pump`, but the relay's connections (those it counts) copied in Python, their bytes
    kept in ``seen`` as the relay sees them: per connection, the peer's and the relayed node's."""

    def carry(a: socket.socket, b: socket.socket, first: bytes = b"",
              carried: Callable[[int], None] | None = None) -> None:
        if carried is None:  # a relayed node's tunnel, not the relay
            return pump(a, b, first, carried)
        peer, node = bytearray(), bytearray()  # ``first`` is the peer's too: one_way keeps it as it passes it on
        seen.append((peer, node))

        def one_way(src: socket.socket, dst: socket.socket, into: bytearray, data: bytes = b"") -> None:
            try:
                while data or (data := src.recv(1 << 16)):
                    into += data
                    carried(len(data))
                    dst.sendall(data)
                    data = b""
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=one_way, args=(b, a, node))
        back.start()
        one_way(a, b, peer, first)
        back.join()
        return None

    return carry


def tls_records(stream: bytes) -> list[int]:
    """The content types of the TLS records ``stream`` is made of; fails if it is anything else (a byte in the
    clear). RFC 8446 §5.1: type (20–23), legacy version 0x0301 or 0x0303, a length of at most 2^14 + 256."""
    types, at = [], 0
    while at < len(stream):
        assert len(stream) - at >= 5, "a record header cut short"
        kind, version, length = stream[at], stream[at + 1 : at + 3], int.from_bytes(stream[at + 3 : at + 5])
        assert kind in (20, 21, 22, 23) and version in (b"\x03\x01", b"\x03\x03") and length <= (1 << 14) + 256, (
            f"not a TLS record at byte {at}: {stream[at:at + 16]!r}")
        types.append(kind)
        at += 5 + length
    assert at == len(stream)
    return types


async def test_a_relay_sees_only_tls_and_a_stranger_gets_neither_a_slot_nor_the_node(
        fleet_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytearray, bytearray]] = []  # per connection: the peer's bytes, the relayed node's
    monkeypatch.setattr(relay_module, "pump", recording_pump(seen))
    key, other = new_secret(tmp_path / "swarm.key"), new_secret(tmp_path / "other.key")
    ports = [free_port() for _ in range(2)]
    relay_at = f"127.0.0.1:{ports[0]}"

    def config(node_id: str, **changes: object):  # noqa: ANN202
        return quiet_node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id,
                                 grpc_port=ports[int(node_id[-1])], swarm_key_file=key, mode="async", interval=0.5,
                                 **changes)

    async with running(config("node-0")) as relay, running(config("node-1", peers=[relay_at], relay=relay_at)) as b:
        await until(lambda: b.reach.state == "relayed" and relay.membership.alive_ids() == ["node-1"],
                    what="node-1 relayed by node-0, and known there")
        await until(lambda: b.tally.counters["fusions"] >= 2 and relay.tally.counters["fusions"] >= 2, timeout=60,
                    what="two fusions each way")
        slot = b.reach.address
        assert b.status().relay == "node-0" and relay.status().relaying.slots == 1
        received = b.tally.counters["bytes_received"]  # every model that reached node-1 came through its slot…
        assert received > 0 and sum(len(p) for p, _ in seen) > received
        for peer, node in seen:  # …as TLS records only, both ways: a handshake first, then application data
            for stream in (peer, node):
                types = tls_records(bytes(stream))
                assert types[0] == 22 and set(types) <= {20, 21, 22, 23}
        assert any(23 in tls_records(bytes(p)) for p, _ in seen)

        # a stranger with another key, or none: no slot on the relay…
        stranger = Security(swarm_tls(read_swarm_keys(other), "node-1", ("127.0.0.1",)), swarm_key=True)
        assert stranger.tls is not None
        for channel in (grpc.aio.secure_channel(relay_at, stranger.tls.channel_credentials(),
                                                options=[("grpc.ssl_target_name_override", "node-0")]),
                        grpc.aio.insecure_channel(relay_at)):
            async with channel:
                call = pb_grpc.DflNodeStub(channel).Reserve(pb.ReserveRequest(sender="node-1", swarm="x"), timeout=5)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # …nor the relayed node through its slot: its TLS refuses them (the relay forwarded the bytes unread)
        spliced = relay.status().relaying.connections
        for channel in (grpc.aio.secure_channel(slot, stranger.tls.channel_credentials(),
                                                options=[("grpc.ssl_target_name_override", "node-1")]),
                        grpc.aio.insecure_channel(slot)):
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.DflNodeStub(channel).Hello(pb.HelloRequest(node_id="node-9"), timeout=5)
                assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert relay.status().relaying.connections >= spliced + 2  # the relay passed them on: node-1 refused them
        # a connection that claims to be the relayed node's tunnel, with a guessed token, is closed (a token as the
        # node's are, hex: random bytes may hold a newline, which ends the line early, and the bytes left unread
        # would make the close a reset)
        host, _, port = slot.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(MAGIC + secrets.token_hex(TOKEN_BYTES).encode() + b"\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        fusions = b.tally.counters["fusions"]
        await until(lambda: b.tally.counters["fusions"] > fusions, timeout=30, what="node-1 still learning")
        assert b.reach.address == slot and relay.status().relaying.slots == 1


async def test_a_relay_holds_its_slots_and_gives_them_back_once_its_bytes_are_spent() -> None:
    relay = RelayServer("relay", "127.0.0.1", "127.0.0.1", slots=1, rate=1e6, max_bytes=1000)
    slot = await relay.open("node-1")
    assert slot is not None and await relay.open("node-2") is None and relay.load.refused == 1
    local = f"dfl-test-{uuid.uuid4().hex}"  # the relayed node's own server, on its abstract Unix socket
    server = await asyncio.start_unix_server(_echo, "\0" + local)
    host, _, port = slot.address.rpartition(":")
    peer_reader, peer_writer = await asyncio.open_connection(host, int(port))
    peer_writer.write(b"x" * 600)
    token = await asyncio.wait_for(slot.incoming.get(), 5)  # the relay announces the peer on the reservation
    assert token is not None
    tunnels = Tunnels(slot.address, local)
    tunnels.answer(token)  # the relayed node dials its slot back and carries the peer to its server
    assert await asyncio.wait_for(peer_reader.readexactly(600), 5) == b"x" * 600  # there and back: 1,200 bytes
    assert await asyncio.wait_for(slot.incoming.get(), 5) is None  # spent: the reservation ends
    assert relay.load.bytes >= 1000 and relay.load.connections == 1 and not relay.slots
    assert await relay.open("node-1") is None  # and no slot is given again
    peer_writer.close()
    await relay.stop()
    tunnels.close()
    server.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
