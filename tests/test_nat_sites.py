"""Sites behind NAT in the multi-site testbed: home nodes dial out, nobody dials in, and every --join is dialable.

Most devices of a real fleet sit behind a home router or a carrier's NAT; the testbed must be that strict before a
test of NAT traversal can trust it. One public site and two home sites, checked with real TCP connections made from
inside the namespaces (a listener on every host, each dial with a short timeout): a home host reaches the public
site from its NAT router's transit address, a dial into a home site fails with "unreachable" (no route, not merely
nobody listening), a home site's hosts reach each other directly, and no namespace outlives the topology.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext

import pytest

from dfl_node.testbed.namespaces import run_inside
from dfl_node.testbed.netns import _STALE, NetnsHost, list_namespaces
from dfl_node.testbed.sites import SitesTopology
from tests.helpers.cli import error_lines, invoke

pytestmark = [pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]
PORT = 47811
DIAL_TIMEOUT_S = 3.0  # a refused dial fails at its SYN, or at its first retransmission (1 s) when the ICMP raced it
UNREACHABLE = (errno.ENETUNREACH, errno.EHOSTUNREACH)


@pytest.fixture(scope="module")
def topology() -> Iterator[SitesTopology]:
    """One public site (hosts 0, 1), two home sites (hosts 2, 3 and 4, 5)."""
    with SitesTopology(3, 2, nat=2) as topo:
        yield topo


@pytest.fixture(scope="module")
def listeners(topology: SitesTopology) -> Iterator[dict[str, socket.socket]]:
    """A TCP listener on every host (its socket made in the host's namespace), by host address."""
    servers: dict[str, socket.socket] = {}
    try:
        for host in topology.hosts:
            servers[host.address] = run_inside(host.name, socket.create_server, (host.address, PORT))
            servers[host.address].settimeout(DIAL_TIMEOUT_S)
        yield servers
    finally:
        for server in servers.values():
            server.close()


def _connect(address: str) -> None:
    socket.create_connection((address, PORT), timeout=DIAL_TIMEOUT_S).close()


def dial(source: NetnsHost, address: str, listeners: dict[str, socket.socket]) -> str:
    """Connect from ``source``'s namespace to the listener at ``address``: the peer address the listener saw
    (OSError if the dial failed)."""
    run_inside(source.name, _connect, address)
    conn, (peer, _) = listeners[address].accept()
    conn.close()
    return peer


def refused(source: NetnsHost, address: str, listeners: dict[str, socket.socket]) -> int:
    """The errno of a dial from ``source`` to ``address`` that must fail, after checking that nothing arrived."""
    with pytest.raises(OSError) as failed:
        dial(source, address, listeners)
    listeners[address].setblocking(False)
    try:
        with pytest.raises(BlockingIOError):  # the listener's queue is empty: the SYN never reached it
            listeners[address].accept()
    finally:
        listeners[address].settimeout(DIAL_TIMEOUT_S)
    assert failed.value.errno is not None
    return failed.value.errno


def test_the_topology_says_which_sites_and_hosts_are_behind_nat(topology: SitesTopology) -> None:
    assert (topology.public_sites, topology.nat_sites) == ([0], [1, 2])
    assert [topology.is_behind_nat(i) for i in range(6)] == [False, False, True, True, True, True]
    routers = [topology.nat_routers[s] for s in topology.nat_sites]
    assert [r.address for r in routers] == ["10.78.102.2", "10.78.103.2"]
    others = {topology.router, *(h.name for h in [*topology.hosts, *topology.monitors])}
    for router in routers:  # a crashed run's NAT routers are cleaned up like the rest of its namespaces
        assert router.name in list_namespaces() and router.name not in others
        match = _STALE.match(router.name)
        assert match and match["prefix"] == "dfl" and int(match["pid"]) == os.getpid()


def test_a_home_host_reaches_the_public_site_from_its_nat_routers_address(
        topology: SitesTopology, listeners: dict[str, socket.socket]) -> None:
    for i in (2, 3, 4, 5):
        masquerade = topology.nat_routers[topology.site_of(i)].address
        for public in topology.sites[0]:
            assert dial(topology.hosts[i], public.address, listeners) == masquerade, (i, public)


def test_a_public_host_cannot_dial_into_a_home_site(
        topology: SitesTopology, listeners: dict[str, socket.socket]) -> None:
    for public in topology.sites[0]:
        for i in (2, 3, 4, 5):  # every dial, not only the first few: the core router's ICMP is not rate limited
            assert refused(public, topology.hosts[i].address, listeners) in UNREACHABLE, (public, i)


def test_a_home_host_cannot_reach_the_other_home_site(
        topology: SitesTopology, listeners: dict[str, socket.socket]) -> None:
    for source, target in ((2, 4), (3, 5), (4, 2), (5, 3)):
        assert refused(topology.hosts[source], topology.hosts[target].address, listeners) in UNREACHABLE


def test_hosts_of_one_home_site_reach_each_other_directly(
        topology: SitesTopology, listeners: dict[str, socket.socket]) -> None:
    for source, target in ((2, 3), (3, 2), (4, 5), (5, 4)):
        home = topology.hosts[source]
        assert dial(home, topology.hosts[target].address, listeners) == home.address  # no NAT on its own bridge


def test_every_join_address_is_dialable_from_its_host(
        topology: SitesTopology, listeners: dict[str, socket.socket]) -> None:
    joins = [topology.join_address(i, PORT) for i in range(len(topology.hosts))]
    # the only public site's first host joins its second (not itself); every other host the first public host
    assert joins == [f"10.78.1.3:{PORT}"] + [f"10.78.1.2:{PORT}"] * 5
    for host, join in zip(topology.hosts, joins, strict=True):
        address, port = join.rsplit(":", 1)
        assert int(port) == PORT and address != host.address
        dial(host, address, listeners)


def test_join_addresses_skip_home_sites_and_keep_the_next_public_site() -> None:
    topo = SitesTopology(4, 1, nat=1)  # public 0, 1, 2; home 3 (not built: the choice is arithmetic)
    assert [topo.join_address(i, 1) for i in range(4)] == ["10.78.2.2:1", "10.78.3.2:1", "10.78.1.2:1", "10.78.1.2:1"]
    assert [SitesTopology(3, 1).join_address(i, 1) for i in range(3)] == ["10.78.2.2:1", "10.78.3.2:1", "10.78.1.2:1"]


@pytest.mark.parametrize("nat", [3, 4, -1])
def test_a_topology_without_a_public_site_is_refused(nat: int) -> None:
    with pytest.raises(ValueError, match="nat must be"):
        SitesTopology(3, 2, nat=nat)


@pytest.mark.parametrize("raised", [False, True])
def test_no_namespace_is_left_after_the_block(raised: bool) -> None:
    topo = SitesTopology(2, 1, nat=1)
    outcome: AbstractContextManager[object] = pytest.raises(RuntimeError) if raised else nullcontext()
    with outcome, topo:
        assert sum(topo.tag in name for name in list_namespaces()) == 8  # rt, 2 switches, 2 hosts, 2 monitors, NAT
        if raised:
            raise RuntimeError("the body failed")
    assert not [name for name in list_namespaces() if topo.tag in name]


@pytest.mark.parametrize(("args", "problem"), [
    (["--sites", "3", "--nat-sites", "3", "--netns"], "--nat-sites needs --netns and a --sites above it"),
    (["--nat-sites", "1"], "--nat-sites needs --netns and a --sites above it"),
    (["--nat-sites", "1", "--netns"], "--nat-sites needs --netns and a --sites above it"),
])
def test_the_cli_refuses_nat_sites_without_a_public_site_or_namespaces(args: list[str], problem: str) -> None:
    result = invoke("testbed", "--nodes", "6", *args)
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and problem in lines[0], result.output
