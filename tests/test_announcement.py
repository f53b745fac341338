"""dfl_node.net.announcement: the DNS-SD record and its pure helpers, without any sockets.

Static peers (``parse_peer``), the interface choice for a bind address
(``mdns_interfaces``), the TXT round trip and its limits, instance-name
sanitising, and malformed or foreign records, which must parse to None. The
live zeroconf tests are in ``test_discovery.py``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket

import pytest
from zeroconf import InterfaceChoice
from zeroconf.asyncio import AsyncServiceInfo

from dfl_node.addresses import parse_peer
from dfl_node.net.announcement import SERVICE_TYPE, Announcement, mdns_interfaces, service_name
from tests.helpers.discovery import ann


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("node-1.dfl.svc.cluster.local:1", ("node-1.dfl.svc.cluster.local", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:50051", ("::1", 50051)),
        ("[fe80::1%eth0]:7", ("fe80::1%eth0", 7)),
    ],
)
def test_parse_peer_accepts(spec: str, expected: tuple[str, int]) -> None:
    assert parse_peer(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "", "host", "host:", ":50051", "host:0", "host:65536", "host:-1", "host:+80", "host:80x",
        "host:٥٠", " host:80", "host :80", "ho st:80", "::1:50051", "[::1]", "[::1]50051",
        "[::1:80", "[not-v6]:80", "[127.0.0.1]:80", "host:123456", "bad_-.:80", "a..b:80",
    ],
)
def test_parse_peer_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="peer"):
        parse_peer(spec)


def test_mdns_interfaces() -> None:
    assert mdns_interfaces("127.0.0.1") == ["127.0.0.1"]
    assert mdns_interfaces("localhost") == ["127.0.0.1"]
    assert mdns_interfaces("10.77.0.3") == ["10.77.0.3"]
    assert mdns_interfaces("0.0.0.0") is InterfaceChoice.All
    for bad in ("::1", "node.example", "224.0.0.251", ""):
        with pytest.raises(ValueError):
            mdns_interfaces(bad)


def test_txt_round_trip_and_limits() -> None:
    me = ann("rt", fingerprint="c" * 64)
    txt = me.to_txt()
    assert set(txt) == {"id", "swarm", "grpc", "http", "algo", "fp", "proto", "boot"}
    assert txt["fp"] == "c" * 64 and txt["grpc"] == "50051"
    info = AsyncServiceInfo(SERVICE_TYPE, service_name(me.node_id), port=me.grpc_port, properties=txt,
                            parsed_addresses=["127.0.0.1"])
    assert Announcement.from_service_info(info) == me
    assert ann("long", fingerprint="d" * 100).to_txt()["fp"] == "d" * 16
    with pytest.raises(ValueError):
        ann("x" * 300).to_txt()
    with pytest.raises(ValueError):
        dataclasses.replace(me, node_id="").to_txt()
    with pytest.raises(ValueError):
        dataclasses.replace(me, algorithm="a\nb").to_txt()


def test_service_name_is_a_valid_label() -> None:
    assert service_name("node-a") == "node-a." + SERVICE_TYPE
    for node_id in ("n" * 200, "dots.and spaces/ü", "x" * 63 + "y"):
        label = service_name(node_id)[: -len(SERVICE_TYPE) - 1]
        assert 0 < len(label.encode()) <= 63 and label.replace("-", "").replace("_", "").isalnum()
    assert service_name("a.b") != service_name("a-b")  # sanitizing keeps ids apart


def _info(props, *, name: str | None = None, addrs=("127.0.0.1",), type_: str = SERVICE_TYPE):
    return AsyncServiceInfo(type_, name or service_name("n1"), port=1, properties=props,
                            parsed_addresses=list(addrs))


GOOD = {"id": "n1", "swarm": "s", "grpc": "5", "http": "0", "algo": "a", "fp": "f", "proto": "1", "boot": "b"}


@pytest.mark.parametrize(
    "info",
    [
        _info({}),
        _info(b"\xff\x00garbage"),  # raw TXT whose length byte overruns
        _info(b"\x03a=\xff"),  # undecodable value
        _info({**GOOD, "grpc": "0"}),
        _info({**GOOD, "grpc": "65536"}),
        _info({**GOOD, "grpc": "5x"}),
        _info({**GOOD, "http": "-1"}),
        _info({**GOOD, "proto": "one"}),
        _info({**GOOD, "id": ""}),
        _info({**GOOD, "swarm": None}),  # key without value
        _info({**GOOD, "algo": "\x00evil"}),
        _info({k: v for k, v in GOOD.items() if k != "boot"}),
        _info({**GOOD, b"\xfe": b"x"}),
        _info(GOOD, name=service_name("someone-else")),  # id does not match the instance
        _info(GOOD, addrs=()),  # no IPv4 address
        _info(GOOD, addrs=("::1",)),
        _info(GOOD, name="n1._other._tcp.local.", type_="_other._tcp.local."),
    ],
)
def test_from_service_info_rejects_garbage(info: AsyncServiceInfo) -> None:
    assert Announcement.from_service_info(info) is None


def test_from_service_info_accepts_minimal() -> None:
    got = Announcement.from_service_info(_info(GOOD, addrs=("127.0.0.1", "10.0.0.9")))
    assert got is not None and got.host == "10.0.0.9" and got.grpc_port == 5 and got.http_port == 0


def test_an_advertised_host_name_is_announced_as_its_ipv4_addresses() -> None:
    """compose and Kubernetes advertise host names (DFL_ADVERTISE=node-0); mDNS carries addresses."""
    from dfl_node.net.discovery import _announced_addresses

    addresses = _announced_addresses(socket.gethostname())
    assert addresses and all(ipaddress.ip_address(a).version == 4 for a in addresses)
    with pytest.raises(ValueError, match="cannot resolve the advertised host 'no-such-node.invalid'"):
        _announced_addresses("no-such-node.invalid")
