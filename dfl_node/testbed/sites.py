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

Sites behind NAT (``nat``: the last ones) are what most devices of a real fleet sit behind — a home router, a
carrier's NAT: their nodes can connect out, nobody can connect in. Such a site s has a router of its own, between
its bridge and the core router (the one above, which then has no leg on that site)::

    <tag>-s<s>h0  the NAT router: rt<s> = <base>.<s>.1/24 (the site's gateway, as above), wan = <base>.<100+s>.2/24,
                  default route via <base>.<100+s>.1, IP forwarding on, MASQUERADE out of wan
    <tag>-rt      wan<s> = <base>.<100+s>.1/24: the transit subnet is all the core router knows of the site

No route leads into a home subnet and no port is forwarded, so a connection to a home address fails, from a public
site or from another home site: the core router answers "network unreachable" (unthrottled: with its ICMP rate limit
on, a dial after the first few would wait out its SYN retries instead of failing within a second). A home node's
connections reach the public sites from its NAT router's transit address. The NAT router is named like a host 0 of
its site (hosts start at 1) so that :func:`~.netns.cleanup_stale` recognises it as one of a run's namespaces.
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
MAX_SITES_WITH_NAT = 100  # with NAT: the transit subnets <base>.101.. stay clear of the sites' <base>.1..


class SitesTopology(NetnsTopology):
    """``sites`` sites of ``per_site`` hosts each, routed through one router namespace; the last ``nat`` of them
    behind a masquerading router of their own."""

    def __init__(self, sites: int, per_site: int, prefix: str = "dfl", base: str = "10.78", nat: int = 0) -> None:
        if not 2 <= sites <= 250 or not 1 <= per_site <= 250:
            raise ValueError("sites must be 2..250 and hosts per site 1..250")
        if not 0 <= nat < sites:
            raise ValueError("nat must be 0..sites-1: a node behind NAT joins through a public site, so one is needed")
        if nat and sites > MAX_SITES_WITH_NAT:
            raise ValueError(f"with nat, at most {MAX_SITES_WITH_NAT} sites (<base>.<100+s> are the transit subnets)")
        super().__init__(1, prefix)  # only its naming, checks and teardown: _build below replaces its layout
        self.tag = f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.router, self.base, self.per_site = f"{self.tag}-rt", base, per_site
        self.sites = [[NetnsHost(f"{self.tag}-s{s}h{i}", f"{base}.{s}.{i + 1}") for i in range(1, per_site + 1)]
                      for s in range(1, sites + 1)]
        self.hosts = [h for site in self.sites for h in site]
        self.monitors = [NetnsHost(f"{self.tag}-s{s}m", f"{base}.{s}.254") for s in range(1, sites + 1)]
        # site (0-based) -> its NAT router, at the address its home nodes' connections come from
        self.nat_routers = {s - 1: NetnsHost(f"{self.tag}-s{s}h0", f"{base}.{100 + s}.2")
                            for s in range(sites - nat + 1, sites + 1)}

    @property
    def nat_sites(self) -> list[int]:
        """The sites (0-based) behind NAT: the last ones."""
        return sorted(self.nat_routers)

    @property
    def public_sites(self) -> list[int]:
        """The sites (0-based) that the core router routes into: every node can dial their hosts."""
        return [s for s in range(len(self.sites)) if s not in self.nat_routers]

    def site_of(self, index: int) -> int:
        """The site (0-based) of host ``index`` (0-based, site by site)."""
        return index // self.per_site

    def is_behind_nat(self, index: int) -> bool:
        """Whether host ``index`` (0-based) sits behind NAT: it can dial out, and only its own site can dial it."""
        return self.site_of(index) in self.nat_routers

    def join_address(self, index: int, port: int) -> str:
        """The ``--join`` address of host ``index``: the first host of the next site, one it can dial (see
        :meth:`seed`)."""
        return f"{self.seed(index).address}:{port}"

    def seed(self, index: int) -> NetnsHost:
        """The host that host ``index`` joins through, always one it can dial: the first host of the next site;
        of the first public site for a home node (nobody dials into a home site) and for a public node whose next
        site is a home site; of its own site when it is the only public one (its second host, if it is the first:
        a join through oneself finds nobody)."""
        site, public = self.site_of(index), self.public_sites
        following = (site + 1) % len(self.sites)
        if site not in self.nat_routers and following not in self.nat_routers:
            return self.sites[following][0]
        others = [s for s in public if s != site]
        if others:
            return self.sites[others[0]][0]
        own = self.sites[site]
        return own[1] if own[0] is self.hosts[index] and len(own) > 1 else own[0]

    def _build(self) -> None:
        self._add_namespace(self.router)
        _forward(self.router)
        if self.nat_routers:  # every dial into a home site answered "network unreachable", not a few a second
            _ip("netns", "exec", self.router, "sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0")
        for s in range(1, len(self.sites) + 1):
            switch = f"{self.tag}-s{s}"
            self._add_namespace(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            _ip("-n", switch, "link", "set", "br0", "up")
            gateway = self._add_nat_router(s) if s - 1 in self.nat_routers else self.router
            _ip("link", "add", f"rt{s}", "netns", gateway, "type", "veth", "peer", "name", "uplink", "netns", switch)
            _ip("-n", switch, "link", "set", "dev", "uplink", "master", "br0", "up")
            _ip("-n", gateway, "addr", "add", f"{self.base}.{s}.1/24", "dev", f"rt{s}")
            _ip("-n", gateway, "link", "set", f"rt{s}", "up")
            self._add_hosts(s, switch)

    def _add_nat_router(self, s: int) -> str:
        """Site ``s``'s (1-based) NAT router, its wan leg on a transit subnet of its own to the core router, which
        learns that subnet and nothing behind it."""
        name, transit = self.nat_routers[s - 1].name, f"{self.base}.{100 + s}"
        self._add_namespace(name)
        _forward(name)
        _ip("link", "add", f"wan{s}", "netns", self.router, "type", "veth", "peer", "name", "wan", "netns", name)
        _ip("-n", self.router, "addr", "add", f"{transit}.1/24", "dev", f"wan{s}")
        _ip("-n", self.router, "link", "set", f"wan{s}", "up")
        _ip("-n", name, "addr", "add", f"{transit}.2/24", "dev", "wan")
        _ip("-n", name, "link", "set", "wan", "up")
        _ip("-n", name, "route", "add", "default", "via", f"{transit}.1")
        _ip("netns", "exec", name, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE")
        return name

    def _add_hosts(self, s: int, switch: str) -> None:
        """Site ``s``'s (1-based) hosts and monitor on its switch, their default route via the site's gateway."""
        for i, host in enumerate([*self.sites[s - 1], self.monitors[s - 1]], 1):
            self._add_namespace(host.name)
            _ip("link", "add", "veth0", "netns", host.name, "type", "veth", "peer", "name", f"p{i}", "netns", switch)
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


def _forward(namespace: str) -> None:
    """IP forwarding on in a router's namespace (each namespace has its own setting, off by default)."""
    _ip("netns", "exec", namespace, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")


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
