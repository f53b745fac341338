"""The swarm key: mutual TLS with a swarm CA derived from the key (:mod:`dfl_node.net.swarm_tls`), on
in-process nodes over real gRPC.

- Every key holder derives the same CA; each node issues itself a fresh certificate at start, which passes the
  checks a certificate file of mutual TLS passes.
- A peer without the key, or with another one, fails the TLS handshake (counted) and never enters the peer table;
  a key holder can claim any node id (the documented limit), but a connection speaks only for the id of its
  certificate.
- Rollover: a node holding the current and the next key talks to both generations; a node that holds only the old
  key does not talk to one that presents the new.

A man in the middle (tampering, eavesdropping): ``tests/test_swarm_key_wire.py``. Mutual TLS with files and
authenticated fleets against the simulator: ``tests/test_auth.py``.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from dfl_node.net.auth import Security
from dfl_node.net.certs import new_secret
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.swarm_tls import derived_ca, read_swarm_keys, swarm_tls
from dfl_node.net.tls import TlsFiles, dns_names, load_tls
from dfl_node.peering.errors import PeerUnauthenticated, PeerUnreachable
from dfl_node.service.run import announcement
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import hello_from, quiet_node_config, running
from tests.helpers.waiting import until


def test_every_key_holder_derives_the_same_ca_and_each_node_issues_its_own_certificate(tmp_path: Path) -> None:
    key, other = (read_swarm_keys(new_secret(tmp_path / name))[0] for name in ("swarm.key", "other.key"))
    ca, ca_key = derived_ca.__wrapped__(key)  # computed afresh, as another node would
    assert ca.public_bytes(Encoding.PEM) == derived_ca(key)[0].public_bytes(Encoding.PEM)
    assert ca_key.private_numbers() == derived_ca(key)[1].private_numbers()
    assert derived_ca(other)[0].subject != ca.subject and derived_ca(other)[0].public_key() != ca.public_key()

    first, second = (swarm_tls((key,), "node-0", ("0.0.0.0", "box.lan", "127.0.0.1")) for _ in range(2))
    assert first.ca == second.ca and first.cert != second.cert and first.key != second.key  # a fresh key each start
    cert = x509.load_pem_x509_certificate(first.cert)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert dns_names(cert) == ["node-0", "box.lan"] and [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1"]  # the wildcard is no address
    for name, data in (("ca.crt", first.ca), ("node.crt", first.cert), ("node.key", first.key)):
        (tmp_path / name).write_bytes(data)
    checked = load_tls(TlsFiles(tmp_path / "ca.crt", tmp_path / "node.crt", tmp_path / "node.key"), "node-0")
    assert checked.cert == first.cert  # what mutual TLS checks in a node's files, the issued material passes

    rolling = swarm_tls((other, key), "node-0", ("127.0.0.1",))  # current key first: its CA issues
    roots = x509.load_pem_x509_certificates(rolling.ca)
    assert [r.subject for r in roots] == [derived_ca(other)[0].subject, ca.subject]
    x509.load_pem_x509_certificate(rolling.cert).verify_directly_issued_by(roots[0])


def _channel(address: str, security: Security, name: str) -> grpc.aio.Channel:
    assert security.tls is not None
    return grpc.aio.secure_channel(address, security.tls.channel_credentials(),
                                   options=[("grpc.ssl_target_name_override", name),
                                            ("grpc.use_local_subchannel_pool", 1)])


async def test_keyless_and_wrong_key_peers_fail_the_handshake_and_a_connection_speaks_for_its_certificate(
        fleet_shards: Path, tmp_path: Path) -> None:
    key, other = new_secret(tmp_path / "swarm.key"), new_secret(tmp_path / "other.key")

    def config(node_id: str, peers: list[str], port: int, key_file: Path | None):  # noqa: ANN202
        return quiet_node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id,
                                 grpc_port=port, swarm_key_file=key_file, peers=peers, mode="async", interval=3600)

    ports = [free_port() for _ in range(4)]
    a, b, c, d = (f"127.0.0.1:{p}" for p in ports)
    async with running(config("node-0", [b, c, d], ports[0], key)) as node0, \
            running(config("node-1", [a], ports[1], key)) as node1, \
            running(config("node-2", [a], ports[2], other)) as wrong_key, \
            running(config("node-3", [a], ports[3], None)) as keyless:
        await until(lambda: node0.membership.alive_ids() == ["node-1"] and node1.membership.alive_ids() == ["node-0"])
        # each side of the wrong key fails the other's certificate
        await until(lambda: node0.tally.rejected["tls_handshake"] >= 3
                    and wrong_key.tally.rejected["tls_handshake"] >= 3)
        assert set(node0.membership.table.peers) == {"node-1"} and not node0.membership.table.pending
        assert not wrong_key.membership.table.peers and not keyless.membership.table.peers
        assert node0.status().authentication == "swarm-key" and keyless.status().authentication == "none"

        # a key holder derives the CA: it can issue itself a certificate for any node id (docs/security.md)…
        holder = Security(swarm_tls(read_swarm_keys(key), "node-9", ("127.0.0.1",)), swarm_key=True)
        rejected = node0.tally.rejected
        async with _channel(a, holder, "node-0") as channel:
            stub = pb_grpc.DflNodeStub(channel)
            reply = await stub.Hello(hello_from(node0, node_id="node-9", grpc_address="127.0.0.1:9"), timeout=5)
            assert reply.accepted, reply.reason
            # …but a connection speaks only for its certificate's id
            reply = await stub.Hello(hello_from(node0, node_id="node-1", grpc_address=b), timeout=5)
            assert (reply.accepted, reply.reason) == (False, "identity_mismatch")
            answer = await stub.Probe(pb.ProbeRequest(sender="node-9", swarm=node0.config.swarm), timeout=5)
            assert (answer.ok, answer.reason) == (False, "not_selecting")  # served: node-0 is not selecting
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.Probe(pb.ProbeRequest(sender="node-1", swarm=node0.config.swarm), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert rejected["identity_mismatch"] == 2
        async with grpc.aio.insecure_channel(a) as plain:  # no TLS at all: no connection
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.DflNodeStub(plain).Hello(hello_from(node0), timeout=3)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        secret = read_swarm_keys(key)[0].decode()
        assert not any(secret in v for v in announcement(node0).to_txt().values())
        assert secret not in repr(node0.network.security) and secret not in node0.status().model_dump_json()


async def test_a_rollover_node_talks_to_both_key_generations(fleet_shards: Path, tmp_path: Path) -> None:
    """(K1 current, K2 next) talks to (K2, K1) and to (K1), both ways; (K1) and (K2, K1) do not talk: (K2, K1)
    presents a certificate of K2's CA, which (K1) does not trust. Each pair's Hello on each node's own link."""
    k1, k2 = (read_swarm_keys(new_secret(tmp_path / f"{name}.key"))[0].decode() for name in ("k1", "k2"))
    files = {"node-0": f"{k1}\n{k2}\n", "node-1": f"{k2}\n{k1}\n", "node-2": f"{k1}\n"}
    ports = {node_id: free_port() for node_id in files}

    def config(node_id: str):  # noqa: ANN202
        (tmp_path / f"{node_id}.key").write_text(files[node_id])
        return quiet_node_config(fleet_shards, tmp_path / node_id, id=node_id, data=fleet_shards / node_id,
                                 grpc_port=ports[node_id], swarm_key_file=tmp_path / f"{node_id}.key", mode="async",
                                 interval=3600)

    async with running(config("node-0")) as both, running(config("node-1")) as switched, \
            running(config("node-2")) as old:
        nodes = {"node-0": both, "node-1": switched, "node-2": old}

        async def hello(source: str, target: str) -> str:
            node = nodes[source]
            try:
                reply = await node.network.link(f"127.0.0.1:{ports[target]}").hello(node.hello(), timeout=5)
            except (PeerUnauthenticated, PeerUnreachable) as exc:
                return exc.reason
            assert reply.node_id == target
            return "accepted" if reply.accepted else reply.reason

        assert {(a, b): await hello(a, b) for a in nodes for b in nodes if a != b} == {
            ("node-0", "node-1"): "accepted", ("node-1", "node-0"): "accepted",
            ("node-0", "node-2"): "accepted", ("node-2", "node-0"): "accepted",
            ("node-2", "node-1"): "tls_handshake",  # node-2 fails node-1's certificate
            ("node-1", "node-2"): "unavailable",  # node-2's server fails node-1's (TLS 1.3: a closed connection)
        }
