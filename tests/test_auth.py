"""An authenticated swarm: mutual TLS with the swarm's CA, from files or derived from a swarm key.

- ``dfl-node certs`` issues the CA, node certificates and swarm keys; a node told to authenticate
  whose files are missing or wrong refuses to start with one line (exit 1), never runs without it.
- In-process nodes on loopback (real gRPC): a peer without a valid certificate is refused at the TLS
  handshake, one whose certificate names another node at Hello, counted in ``rejected``, and never enters
  the peer table. The swarm key's TLS in process: ``tests/test_swarm_key.py``.
- Fleets of real daemons with mTLS and with a swarm key run rounds and end bit-identical to the simulator.
"""

from __future__ import annotations

import datetime as dt
import shutil
import stat
from pathlib import Path

import grpc
import pytest
import torch
from click.testing import CliRunner
from cryptography import x509
from safetensors.torch import load_file

from dfl_node import PROTOCOL_VERSION
from dfl_node.cli import cli
from dfl_node.errors import OperatorError
from dfl_node.net.certs import new_secret
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.swarm_tls import read_swarm_keys
from dfl_node.net.tls import TlsError, TlsFiles, dns_names, load_tls
from dfl_node.service.run import _bind_http, announcement
from dfl_node.service.wiring import Daemon
from dfl_node.testbed.launcher import all_done, free_port, wait_until
from tests.helpers.fleet import FLEET, loopback_fleet, simulated
from tests.helpers.nodes import hello_from, quiet_node_config, running, start_cli
from tests.helpers.waiting import until


def test_certs_cli_issues_the_ca_node_certificates_and_a_swarm_key(tmp_path: Path) -> None:
    runner, ca, out = CliRunner(), tmp_path / "ca", tmp_path / "tls" / "node-7"
    done = runner.invoke(cli, ["certs", "init", "--out", str(ca)])
    assert done.exit_code == 0, done.output
    done = runner.invoke(cli, ["certs", "issue", "node-7", "--ca", str(ca), "--out", str(out), "--dns", "n7.lan",
                               "--ip", "10.0.0.7"])
    assert done.exit_code == 0, done.output
    cert = x509.load_pem_x509_certificate((out / "node.crt").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes()))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert dns_names(cert) == ["node-7", "n7.lan"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert (out / "ca.crt").read_bytes() == (ca / "ca.crt").read_bytes()
    for key in (ca / "ca.key", out / "node.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert load_tls(TlsFiles(out / "ca.crt", out / "node.crt", out / "node.key"), "node-7").node_id == "node-7"

    again = runner.invoke(cli, ["certs", "init", "--out", str(ca)])  # a CA is never replaced by accident
    assert again.exit_code == 1 and "exists; not overwriting the swarm CA" in again.output
    bad = runner.invoke(cli, ["certs", "issue", "no such id", "--ca", str(ca)])
    assert bad.exit_code == 2 and "is not a node id" in bad.output

    done = runner.invoke(cli, ["certs", "swarm-key", str(tmp_path / "swarm.key")])
    assert done.exit_code == 0 and stat.S_IMODE((tmp_path / "swarm.key").stat().st_mode) == 0o600
    assert [len(key) for key in read_swarm_keys(tmp_path / "swarm.key")] == [64]


def test_tls_files_are_checked_at_load(pki: Path) -> None:
    files = TlsFiles(pki / "node-0" / "ca.crt", pki / "node-0" / "node.crt", pki / "node-0" / "node.key")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=800)
    with pytest.raises(TlsError, match=r"expired on \d{4}-\d\d-\d\d; issue a new one"):
        load_tls(files, "node-0", now=later)
    earlier = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    with pytest.raises(TlsError, match="is not valid before .* clock right"):
        load_tls(files, "node-0", now=earlier)


# ----------------------------------------------------------------------------- refusing to start


def _settings(pki: Path, tmp_path: Path, case: str) -> tuple[dict, str]:
    """Node settings for one misconfiguration, and the one line it must be refused with."""
    own = pki / "node-0"
    broken = tmp_path / "broken"
    shutil.copytree(own, broken)
    if case == "missing certificate":
        (broken / "node.crt").unlink()
        return {"tls_dir": broken}, (f"--tls-cert {broken / 'node.crt'} does not exist "
                                     "(issue one with `dfl-node certs issue`)")
    if case == "another node's certificate":
        return ({"tls_ca": own / "ca.crt", "tls_cert": pki / "node-1" / "node.crt",
                 "tls_key": pki / "node-1" / "node.key"},
                f"--tls-cert {pki / 'node-1' / 'node.crt'} is for node 'node-1', not --id 'node-0' (a node certificate "
                "names its node id as CN and DNS name: `dfl-node certs issue NODE-ID`)")
    if case == "a key of another certificate":
        shutil.copy(pki / "node-1" / "node.key", broken / "node.key")
        return {"tls_dir": broken}, (f"--tls-key {broken / 'node.key'} is not the key of "
                                     f"--tls-cert {broken / 'node.crt'}")
    if case == "a certificate of another CA":
        return ({"tls_ca": own / "ca.crt", "tls_cert": pki / "intruder" / "node.crt",
                 "tls_key": pki / "intruder" / "node.key"},
                f"--tls-cert {pki / 'intruder' / 'node.crt'} is not signed by the swarm CA --tls-ca {own / 'ca.crt'}")
    if case == "a node certificate as the CA":
        return ({"tls_dir": own, "tls_ca": own / "node.crt"},
                f"--tls-ca {own / 'node.crt'} is not a CA certificate (make the swarm CA with `dfl-node certs init`)")
    if case == "a key that is not PEM":
        (broken / "node.key").write_text("not a key\n")
        return {"tls_dir": broken}, f"--tls-key {broken / 'node.key'} is not a PEM private key"
    if case == "a certificate without its key":
        return ({"tls_cert": own / "node.crt"}, "TLS is configured but --tls-ca and --tls-key is not: mutual TLS needs "
                "the swarm CA, this node's certificate and its key (or --tls-dir with ca.crt, node.crt and node.key)")
    if case == "a short swarm key":
        (tmp_path / "short.key").write_text("0123456789\n")
        return ({"swarm_key_file": tmp_path / "short.key"}, f"swarm key file {tmp_path / 'short.key'} holds 10 bytes; "
                "a swarm key needs at least 32 (make one with `dfl-node certs swarm-key FILE`)")
    if case == "three swarm keys":
        (tmp_path / "three.key").write_text("".join(f"{'k' * 32}{i}\n" for i in range(3)))
        return ({"swarm_key_file": tmp_path / "three.key"}, f"swarm key file {tmp_path / 'three.key'} holds 3 keys; "
                "it holds the current key and at most the next one, one a line")
    if case == "a short next swarm key":
        (tmp_path / "next.key").write_text(f"{'k' * 32}\nshort\n")
        return ({"swarm_key_file": tmp_path / "next.key"}, f"swarm key file {tmp_path / 'next.key'}: line 2 holds 5 "
                "bytes; a swarm key needs at least 32 (make one with `dfl-node certs swarm-key FILE`)")
    if case == "a swarm key and mutual TLS":
        return ({"swarm_key_file": new_secret(tmp_path / "swarm.key"), "tls_dir": own},
                "--swarm-key-file and mutual TLS (--tls-dir, --tls-ca/--tls-cert/--tls-key) are two ways to the same "
                "TLS, with a CA derived from the key or the CA of the files: give one")
    assert case == "a missing swarm key"
    return ({"swarm_key_file": tmp_path / "none.key"}, f"swarm key file {tmp_path / 'none.key'} does not exist "
            f"(make one with `dfl-node certs swarm-key {tmp_path / 'none.key'}`)")


@pytest.mark.parametrize("case", ["missing certificate", "another node's certificate",
                                  "a key of another certificate", "a certificate of another CA",
                                  "a node certificate as the CA", "a key that is not PEM",
                                  "a certificate without its key", "a short swarm key", "a missing swarm key",
                                  "three swarm keys", "a short next swarm key", "a swarm key and mutual TLS"])
def test_unusable_credentials_stop_the_node_before_anything(fleet_shards: Path, pki: Path, tmp_path: Path,
                                                            case: str) -> None:
    settings, line = _settings(pki, tmp_path, case)
    with pytest.raises(OperatorError) as refused:
        Daemon.build(quiet_node_config(fleet_shards, tmp_path / "state", **settings))
    assert str(refused.value) == line
    assert not (tmp_path / "state").exists()  # nothing locked or written


async def test_dfl_node_start_with_tls_and_a_missing_certificate_exits_1_with_one_line(
        fleet_shards: Path, pki: Path, tmp_path: Path) -> None:
    settings, line = _settings(pki, tmp_path, "missing certificate")
    status, lines, text = await start_cli(quiet_node_config(fleet_shards, tmp_path / "state", **settings))
    assert status == 1 and lines == [f"error: {line}"] and "serving" not in text


# ----------------------------------------------------------------------------- mutual TLS


def _channel(address: str, folder: Path, name: str) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials((folder / "ca.crt").read_bytes(), (folder / "node.key").read_bytes(),
                                         (folder / "node.crt").read_bytes())
    return grpc.aio.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", name),
                                                            ("grpc.use_local_subchannel_pool", 1)])


async def test_mtls_a_foreign_certificate_is_refused_at_the_handshake_and_a_false_id_at_hello(
        fleet_shards: Path, pki: Path, tmp_path: Path) -> None:
    def config(node_id: str, folder: Path, peers: list[str], port: int):  # noqa: ANN202
        return quiet_node_config(fleet_shards, tmp_path / node_id / folder.name, id=node_id,
                                 data=fleet_shards / node_id, grpc_port=port, tls_dir=folder, peers=peers,
                                 mode="async", interval=3600)

    ports = [free_port() for _ in range(3)]
    a, b, x = (f"127.0.0.1:{p}" for p in ports)
    async with running(config("node-0", pki / "node-0", [b, x], ports[0])) as node0, \
            running(config("node-1", pki / "node-1", [a], ports[1])) as node1, \
            running(config("node-2", pki / "intruder", [a], ports[2])) as intruder:
        await until(lambda: node0.membership.alive_ids() == ["node-1"] and node1.membership.alive_ids() == ["node-0"])
        await until(lambda: node0.tally.rejected["tls_handshake"] >= 3
                    and intruder.tally.rejected["tls_handshake"] >= 3)
        # neither side took the other in
        assert "node-2" not in node0.membership.table.peers and not intruder.membership.table.peers
        assert node0.status().authentication == "mtls" and node0.network.names == {b: "node-1"}

        # node-1's certificate, a Hello in node-3's name: refused at Hello, counted
        async with _channel(a, pki / "node-1", "node-0") as channel:
            stub = pb_grpc.DflNodeStub(channel)
            reply = await stub.Hello(hello_from(node0, node_id="node-3", grpc_address="127.0.0.1:9"), timeout=5)
            assert (reply.accepted, reply.reason) == (False, "identity_mismatch")
            assert "node-3" not in node0.membership.table.peers and "node-3" not in node0.membership.table.pending
            # a transfer and a probe in another node's name
            frames = [pb.Frame(header=pb.TransferHeader(protocol_version=PROTOCOL_VERSION, sender="node-3",
                                                        swarm=node0.config.swarm))]
            verdicts = [f async for f in stub.Transfer(iter(frames), timeout=5)]
            assert (verdicts[0].result.accepted, verdicts[0].result.reason) == (False, "identity_mismatch")
            with pytest.raises(grpc.aio.AioRpcError) as probe:
                await stub.Probe(pb.ProbeRequest(sender="node-3", swarm=node0.config.swarm), timeout=5)
            assert probe.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert node0.tally.rejected["identity_mismatch"] == 3
        async with grpc.aio.insecure_channel(a) as plain:  # no certificate at all: no connection
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.DflNodeStub(plain).Hello(hello_from(node0), timeout=3)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        txt = announcement(node0).to_txt()  # mDNS says who we are, nothing that proves it
        assert not any("CERTIFICATE" in v or "KEY" in v for v in txt.values())


# ----------------------------------------------------------------------------- fleets ≡ the simulator


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "algorithm"), [("mtls", "defkt-select"), ("swarm-key", "fairavg")])
def test_authenticated_fleet_equals_simulator(fleet_shards: Path, pki: Path, tmp_path: Path, mode: str,
                                              algorithm: str) -> None:
    """defkt-select: Hello, Assign, Probe, Transfer and PassToken; fairavg: Pull. Every one authenticated."""
    config = FLEET.model_copy(update={"rounds": 10})
    key = new_secret(tmp_path / "swarm.key")
    per_node = (lambda node_id: {"tls_dir": pki / node_id}) if mode == "mtls" else (lambda _: {"swarm_key_file": key})
    with loopback_fleet(fleet_shards, tmp_path, algorithm, config, mdns=False, static_peers=True,
                        per_node=per_node) as nodes:
        statuses = wait_until(nodes, all_done, timeout=180)
        logs = "\n".join(n.log_path.read_text() for n in nodes)
    assert logs.count(f"authentication: {mode}") == len(nodes)
    result, models = simulated(config, algorithm, tmp_path / "sim")
    expected = {n.id: n for n in result.nodes}
    for node in nodes:
        mine = load_file(str(node.state_dir / "model.safetensors"))
        theirs = models[node.id]
        assert max(float((mine[k] - theirs[k]).abs().max()) for k in theirs) == 0.0, node.id
        assert statuses[node.id]["models_sent"] == expected[node.id].models_sent
        assert statuses[node.id]["rejected"] == {}, statuses[node.id]["rejected"]  # nothing legitimate was refused
    assert sum(s["models_sent"] for s in statuses.values()) > 0
    assert all(torch.isfinite(t).all() for t in load_file(str(nodes[0].state_dir / "model.safetensors")).values())


def test_the_rest_api_binds_loopback_unless_told_even_when_grpc_serves_every_interface(
        fleet_shards: Path, tmp_path: Path) -> None:
    everywhere = dict(host="0.0.0.0", advertise="127.0.0.1", http_port=free_port(), insecure=True)
    for changes, bound in ((everywhere, "127.0.0.1"), ({**everywhere, "http_host": "0.0.0.0"}, "0.0.0.0")):
        sock = _bind_http(quiet_node_config(fleet_shards, tmp_path, **changes).api)
        assert sock is not None
        try:
            assert sock.getsockname()[0] == bound
        finally:
            sock.close()
