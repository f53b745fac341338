"""mDNS / DNS-SD discovery of the peers of a swarm.

Each node registers one service of type ``_dfl._tcp.local.`` whose TXT record
says who it is and how to reach it (keys ``id swarm grpc http algo fp proto
boot``), and browses the same type to learn about the others. Peers of another
swarm are ignored (logged at debug level); the node never reports itself.

What this module does *not* do: decide whether a peer is alive. mDNS keeps the
records of a crashed (SIGKILLed) node for many minutes, so liveness comes from
the daemon's own pings. A clean :meth:`MdnsDiscovery.stop` sends a goodbye and
peers get ``on_lost`` within milliseconds. A node restarted under the same
``node_id`` carries a fresh ``boot_id``, which turns its re-announcement into
an update that peers report through ``on_found`` again.

Safety: zeroconf is bound only to the interface of the address the node serves
on (:func:`mdns_interfaces`); loopback for the default ``127.0.0.1``. All
interfaces are used only when the operator explicitly binds ``0.0.0.0``
(containers): mDNS multicast out of a machine's real interface is traffic
leaving it, so zeroconf's default (every interface) is never used. zeroconf's
register, update and unregister calls return a second awaitable that must be
awaited too, or no announcement (or goodbye) is sent.

This module holds only the live part (zeroconf registering and browsing). The
record itself and the pure helpers — :class:`Announcement`, names, interface
choice — live in :mod:`dfl_node.net.announcement` so they
can be used and tested without sockets; they are re-exported here, so imports
from ``dfl_node.net.discovery`` keep working.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable

from zeroconf import DNSQuestionType, IPVersion, ServiceStateChange, Zeroconf, current_time_millis
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from dfl_node.net.announcement import (
    SERVICE_TYPE,
    Announcement,
    fingerprint_matches,
    mdns_interfaces,
    server_name,
    service_name,
)

__all__ = [
    "SERVICE_TYPE",
    "Announcement",
    "MdnsDiscovery",
    "fingerprint_matches",
    "mdns_interfaces",
    "service_name",
]

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 3.0
"""How long the resolve of an Added/Updated service may take (it is served from
the cache when the announcement carried all records, which is the usual case)."""
REQUERY_FIRST_S, REQUERY_MAX_S = 30.0, 3600.0
"""The browse queries after zeroconf's own first four (in its first ~14 s): the first this long after the start,
each interval twice the one before (RFC 6762 §5.2), up to an hour (see :meth:`MdnsDiscovery._requery`)."""


def _announced_addresses(host: str) -> list[str]:
    """The IPv4 addresses to announce for ``host``: an address as is, a host name resolved once.

    A host name is what compose and Kubernetes give a node (``DFL_ADVERTISE=node-0``); mDNS carries
    addresses, so it is resolved here, at start-up, and an unresolvable name stops the start.
    """
    host = host.strip()
    if host.lower() == "localhost":
        return ["127.0.0.1"]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return _resolve_ipv4(host)
    if ip.version != 4:
        raise ValueError(f"the announced host must be an IPv4 address, got {host!r}")
    if not ip.is_unspecified:
        return [str(ip)]
    from zeroconf._utils.net import get_all_addresses  # only for the explicit 0.0.0.0 case

    addrs = [a for a in get_all_addresses() if not ipaddress.IPv4Address(a).is_loopback]
    return addrs or ["127.0.0.1"]


def _resolve_ipv4(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve the advertised host {name!r} to an IPv4 address ({exc.strerror})") from None
    return sorted({str(info[4][0]) for info in infos})


# --------------------------------------------------------------------------- #
# The discovery service
# --------------------------------------------------------------------------- #


class MdnsDiscovery:
    """Announces this node and reports peers of the same swarm as they appear, change or say goodbye.

    ``on_found(announcement)`` is called when a peer appears or its record
    changes (a restart shows up as a new ``boot_id``); an unchanged record is not
    reported twice. ``on_lost(node_id)`` is called when a reported peer says
    goodbye (or moves to another swarm). Both run on the event loop and must not
    block. ``bind_host`` (default ``me.host``) selects the interfaces, see
    :func:`mdns_interfaces`.

    One object serves one run: ``start()`` once, ``stop()`` any number of
    times. ``start()`` may raise ``zeroconf.NonUniqueNameException`` when
    zeroconf's probing sees a live node with the same ``node_id``; node ids
    must be unique, but do not rely on this check — between zeroconf instances
    of one host (sharing UDP 5353 on loopback) a unicast probe answer reaches
    only one of the sockets, and a duplicate went undetected when tried.
    """

    def __init__(
        self,
        me: Announcement,
        *,
        on_found: Callable[[Announcement], None],
        on_lost: Callable[[str], None],
        bind_host: str | None = None,
    ) -> None:
        me.to_txt()  # validate early
        self._me = me
        self._on_found = on_found
        self._on_lost = on_lost
        self._bind_host = bind_host if bind_host is not None else me.host
        self._interfaces = mdns_interfaces(self._bind_host)
        self._name = service_name(me.node_id)
        self._server = server_name(me.node_id, me.boot_id)
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._started = False
        self._closing = False
        self._peers: dict[str, Announcement] = {}  # instance name (lower) -> last reported
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._requerying: asyncio.Task[None] | None = None

    @property
    def me(self) -> Announcement:
        return self._me

    @property
    def zeroconf(self) -> AsyncZeroconf | None:
        """The underlying AsyncZeroconf while running (for diagnostics and tests)."""
        return self._aiozc

    def peers(self) -> dict[str, Announcement]:
        """Currently known peers of the swarm, by node id."""
        return {a.node_id: a for a in self._peers.values()}

    def _make_info(self, me: Announcement) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self._name,
            port=me.grpc_port,
            properties=me.to_txt(),
            server=self._server,
            parsed_addresses=_announced_addresses(me.host),
        )

    async def start(self) -> None:
        """Register this node and start browsing. On failure everything is closed again."""
        if self._started:
            raise RuntimeError("MdnsDiscovery.start() called twice")
        self._started = True
        try:
            info = self._make_info(self._me)
            self._aiozc = AsyncZeroconf(interfaces=self._interfaces, ip_version=IPVersion.V4Only)
            # Browse first so peers are learnt while our own name is being probed.
            # QM questions: on loopback every instance shares UDP 5353, where a
            # unicast (QU) answer reaches only one of them.
            self._browser = AsyncServiceBrowser(
                self._aiozc.zeroconf,
                [SERVICE_TYPE],
                handlers=[self._on_state_change],
                question_type=DNSQuestionType.QM,
            )
            await (await self._aiozc.async_register_service(info))  # probe, then announce
            self._info = info
            self._requerying = asyncio.get_running_loop().create_task(self._requery(self._browser))
            log.info("mDNS: announcing %s (%s) on %s", self._me.node_id, self._name, self._interfaces)
        except BaseException:
            await self.stop()
            raise

    async def update(self, me: Announcement) -> None:
        """Re-announce changed TXT (same node id; ports, algorithm, fingerprint may change)."""
        if me.node_id != self._me.node_id:
            raise ValueError("update() cannot change the node id; stop and start a new discovery")
        info = self._make_info(me)
        self._me = me
        if self._aiozc is None or self._info is None or self._closing:
            return
        await (await self._aiozc.async_update_service(info))
        self._info = info

    async def stop(self) -> None:
        """Say goodbye and close. Idempotent; safe after a failed start()."""
        if self._closing or self._aiozc is None:
            return
        self._closing = True
        aiozc, browser, info = self._aiozc, self._browser, self._info
        self._browser = self._info = None
        if self._requerying is not None:
            self._requerying.cancel()
        for task in self._resolving.values():
            task.cancel()
        self._resolving.clear()
        try:
            if browser is not None:
                await browser.async_cancel()
        except Exception:  # noqa: BLE001
            log.warning("mDNS: cancelling the browser failed", exc_info=True)
        try:
            if info is not None:
                await (await aiozc.async_unregister_service(info))  # goodbye
        except Exception:  # noqa: BLE001
            log.warning("mDNS: goodbye for %s failed", self._me.node_id, exc_info=True)
        try:
            await aiozc.async_close()
        finally:
            self._aiozc = None
            self._peers.clear()

    @staticmethod
    async def _requery(browser: AsyncServiceBrowser) -> None:
        """Go on asking who serves our service type. zeroconf's browser asks four times in its first ~14 s, then
        only to refresh the records it holds: a peer whose answers and announcements were all lost meanwhile (a
        lossy link at start) was never found again by browsing, and a round-mode fleet waited for it for good.
        The series goes on as RFC 6762 §5.2 lets it, each interval twice the last, up to an hour; every query
        lists the peers we know (known-answer suppression), so only those we do not know answer."""
        interval = REQUERY_FIRST_S
        while True:
            await asyncio.sleep(interval)
            browser.query_scheduler.async_send_ready_queries(False, current_time_millis(), {SERVICE_TYPE})
            interval = min(2 * interval, REQUERY_MAX_S)

    # -- browser events (run on the event loop; must not block) -------------

    def _on_state_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if self._closing or service_type != SERVICE_TYPE:
            return
        key = name.lower()
        if key == self._name.lower():
            return  # ourselves
        previous = self._resolving.pop(key, None)
        if previous is not None:
            previous.cancel()  # the latest event wins
        if state_change is ServiceStateChange.Removed:
            self._lost(key)
            return
        task = asyncio.get_running_loop().create_task(self._resolve(zeroconf, service_type, name, key))
        self._resolving[key] = task
        task.add_done_callback(functools.partial(self._resolved, key))

    def _resolved(self, key: str, task: asyncio.Task[None]) -> None:
        """A resolution ended: forget it, unless a newer one for the same key replaced it meanwhile."""
        if self._resolving.get(key) is task:
            del self._resolving[key]

    async def _resolve(self, zc: Zeroconf, service_type: str, name: str, key: str) -> None:
        info = AsyncServiceInfo(service_type, name)
        try:
            ok = await info.async_request(zc, RESOLVE_TIMEOUT_S * 1000, question_type=DNSQuestionType.QM)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.debug("mDNS %s: resolving %s failed", self._me.node_id, name, exc_info=True)
            return
        if not ok or self._closing:
            log.debug("mDNS %s: could not resolve %s", self._me.node_id, name)
            return
        ann = Announcement.from_service_info(info)
        if ann is None:
            log.debug("mDNS %s: ignoring malformed record %s", self._me.node_id, name)
            return
        if ann.node_id == self._me.node_id:
            return  # another instance claiming our id; not a peer
        if ann.swarm != self._me.swarm:
            log.debug("mDNS %s: ignoring %s of swarm %r", self._me.node_id, ann.node_id, ann.swarm)
            self._lost(key)  # if it was ours before, it has left
            return
        if self._peers.get(key) == ann:
            return
        self._peers[key] = ann
        try:
            self._on_found(ann)
        except Exception:  # noqa: BLE001 - a callback bug must not stop discovery
            log.exception("mDNS: on_found callback failed for %s", ann.node_id)

    def _lost(self, key: str) -> None:
        ann = self._peers.pop(key, None)
        if ann is None:
            return
        try:
            self._on_lost(ann.node_id)
        except Exception:  # noqa: BLE001
            log.exception("mDNS: on_lost callback failed for %s", ann.node_id)
