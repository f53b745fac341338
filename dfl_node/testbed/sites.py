"""A multi-site testbed: several LANs ("sites"), each a bridge with its nodes, routed to each other.

Layout, for sites ``s`` = 1..S, each of ``n`` hosts::

    <tag>-rt     the router: rt<s> = <base>.<s>.1/24 towards each site, IP forwarding on
    <tag>-s<s>   site s's switch: br0 (mcast_snooping 0) with ports p1..pn and uplink (the router's link)
    <tag>-s<s>h<i>  lo + veth0 = <base>.<s>.<i+1>/24, default route via <base>.<s>.1, 224.0.0.0/4 dev veth0
    <tag>-s<s>m  a monitor on site s's bridge (<base>.<s>.254): what multicast reaches the site

mDNS (224.0.0.251, link-local: no router forwards it, and this one runs no multicast routing) stays within its
site's bridge, so a node finds the nodes of its own site by mDNS and those of the others only through a join.
Unicast crosses the router. As in :mod:`.netns`, nothing is created in the root namespace and no namespace routes
beyond the testbed's subnets, so no traffic leaves the machine; the topology is a context manager that always
removes what it built (and :func:`~.netns.cleanup_stale` a crashed run's namespaces).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from dfl_node.testbed.netns import NetnsHost, NetnsTopology, _ip

MDNS_GROUP, MDNS_PORT = "224.0.0.251", 5353


class SitesTopology(NetnsTopology):
    """``sites`` sites of ``per_site`` hosts each, routed through one router namespace."""

    def __init__(self, sites: int, per_site: int, prefix: str = "dfl", base: str = "10.78") -> None:
        if not 2 <= sites <= 250 or not 1 <= per_site <= 250:
            raise ValueError("sites must be 2..250 and hosts per site 1..250")
        super().__init__(1, prefix)  # only its naming, checks and teardown: _build below replaces its layout
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.router, self.base, self.per_site = f"{self.tag}-rt", base, per_site
        self.sites = [[NetnsHost(f"{self.tag}-s{s}h{i}", f"{base}.{s}.{i + 1}") for i in range(1, per_site + 1)]
                      for s in range(1, sites + 1)]
        self.hosts = [h for site in self.sites for h in site]
        self.monitors = [NetnsHost(f"{self.tag}-s{s}m", f"{base}.{s}.254") for s in range(1, sites + 1)]

    def site_of(self, index: int) -> int:
        """The site (0-based) of host ``index`` (0-based, site by site)."""
        return index // self.per_site

    def join_address(self, index: int, port: int) -> str:
        """The ``--join`` address of host ``index``: the first host of the next site."""
        return f"{self.sites[(self.site_of(index) + 1) % len(self.sites)][0].address}:{port}"

    def _build(self) -> None:
        self._add_namespace(self.router)
        _ip("netns", "exec", self.router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for s, site in enumerate(self.sites, 1):
            switch = f"{self.tag}-s{s}"
            self._add_namespace(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            _ip("-n", switch, "link", "set", "br0", "up")
            _ip("link", "add", f"rt{s}", "netns", self.router, "type", "veth", "peer", "name", "uplink",
                "netns", switch)
            _ip("-n", switch, "link", "set", "dev", "uplink", "master", "br0", "up")
            _ip("-n", self.router, "addr", "add", f"{self.base}.{s}.1/24", "dev", f"rt{s}")
            _ip("-n", self.router, "link", "set", f"rt{s}", "up")
            for i, host in enumerate([*site, self.monitors[s - 1]], 1):
                self._add_namespace(host.name)
                _ip("link", "add", "veth0", "netns", host.name, "type", "veth", "peer", "name", f"p{i}", "netns",
                    switch)
                _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "veth0")
                _ip("-n", host.name, "link", "set", "veth0", "up")
                _ip("-n", host.name, "route", "add", "default", "via", f"{self.base}.{s}.1")
                _ip("-n", host.name, "route", "add", "224.0.0.0/4", "dev", "veth0")

    @contextmanager
    def multicast_seen(self) -> Iterator[dict[int, list[str]]]:
        """While the block runs, each site's monitor listens to mDNS; afterwards the dict holds, for each site
        (0-based), the source addresses of the mDNS packets that reached it."""
        seen: dict[int, list[str]] = {}
        argv = [sys.executable, "-m", "dfl_node.testbed.sites"]
        procs = [subprocess.Popen(m.wrap([*argv, m.address]), stdout=subprocess.PIPE, text=True)
                 for m in self.monitors]
        try:
            yield seen
        finally:
            for s, proc in enumerate(procs):
                proc.send_signal(signal.SIGTERM)
                out, _ = proc.communicate(timeout=10)
                seen[s] = json.loads(out or "[]")


def _listen(address: str) -> None:
    """A site's monitor (run in its namespace): join the mDNS group on ``address``'s interface and collect the
    sources of what arrives until SIGTERM; print them as JSON."""
    sources: set[str] = set()
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", MDNS_PORT))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        struct.pack("4s4s", socket.inet_aton(MDNS_GROUP), socket.inet_aton(address)))
        sock.settimeout(0.2)
        while not stop:
            try:
                sources.add(sock.recvfrom(9000)[1][0])
            except (TimeoutError, InterruptedError):
                continue
    print(json.dumps(sorted(sources)), flush=True)


if __name__ == "__main__":
    _listen(sys.argv[1])
