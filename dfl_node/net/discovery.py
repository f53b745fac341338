"""mDNS / DNS-SD discovery of the peers of a swarm (design §3).

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
(containers). See ``/work/shared/notes/networking.md`` for the traps.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from zeroconf import DNSQuestionType, InterfaceChoice, IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

__all__ = [
    "SERVICE_TYPE",
    "Announcement",
    "MdnsDiscovery",
    "fingerprint_matches",
    "mdns_interfaces",
    "parse_peer",
    "service_name",
]

log = logging.getLogger(__name__)

SERVICE_TYPE = "_dfl._tcp.local."
RESOLVE_TIMEOUT_S = 3.0
"""How long the resolve of an Added/Updated service may take (it is served from
the cache when the announcement carried all records, which is the usual case)."""

MAX_LABEL_BYTES = 63  # DNS label limit (RFC 1035 §2.3.4)
MAX_TXT_VALUE = 200  # bytes; one TXT string is at most 255 bytes including "key="
FP_TXT_MAX = 64  # a sha256 hex digest fits whole
FP_PREFIX_LEN = 16  # longer fingerprints are announced as this prefix

_INSTANCE_BAD = re.compile(r"[^A-Za-z0-9_-]")
_HOST_BAD = re.compile(r"[^a-z0-9-]")
_DIGITS = re.compile(r"[0-9]{1,5}")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


# --------------------------------------------------------------------------- #
# Announcement (the TXT record)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Announcement:
    """What a node announces about itself.

    ``fingerprint`` is announced whole when it is at most 64 characters (a
    sha256 hex digest); a longer one is announced as its first 16 characters,
    so an announcement received from a peer may carry only that prefix. Compare
    with :func:`fingerprint_matches`; the Hello handshake checks the full one.
    ``http_port`` 0 means "no HTTP API".
    """

    node_id: str
    swarm: str
    host: str  # IPv4 address the node serves gRPC on (what peers dial)
    grpc_port: int
    http_port: int
    algorithm: str
    fingerprint: str
    protocol_version: int
    boot_id: str  # random per process start; lets peers see a restart as an update

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def to_txt(self) -> dict[str, str]:
        """TXT properties. Raises ValueError if a value cannot be announced."""
        fp = self.fingerprint if len(self.fingerprint) <= FP_TXT_MAX else self.fingerprint[:FP_PREFIX_LEN]
        txt = {
            "id": self.node_id,
            "swarm": self.swarm,
            "grpc": str(self.grpc_port),
            "http": str(self.http_port),
            "algo": self.algorithm,
            "fp": fp,
            "proto": str(self.protocol_version),
            "boot": self.boot_id,
        }
        _check_fields(txt)
        return txt

    @classmethod
    def from_service_info(cls, info: AsyncServiceInfo) -> Announcement | None:
        """Parse a resolved service; None for anything malformed or foreign.

        Never raises: the records come from the network and may be hostile.
        """
        try:
            return _parse_info(info)
        except Exception:  # noqa: BLE001 - hostile input must never escape
            log.debug("unparseable mDNS record %r", getattr(info, "name", None), exc_info=True)
            return None


def fingerprint_matches(announced: str, full: str) -> bool:
    """True if an announced fingerprint (whole or 16-char prefix) denotes ``full``."""
    if len(full) <= FP_TXT_MAX:
        return announced == full
    return announced == full[:FP_PREFIX_LEN]


def _check_fields(txt: dict[str, str]) -> None:
    for key in ("id", "swarm", "boot"):
        if not txt[key]:
            raise ValueError(f"announcement field {key!r} must not be empty")
    for key, value in txt.items():
        if len(value.encode("utf-8")) > MAX_TXT_VALUE:
            raise ValueError(f"announcement field {key!r} is longer than {MAX_TXT_VALUE} bytes")
        if any(ord(c) < 0x20 or c == "\x7f" for c in value):
            raise ValueError(f"announcement field {key!r} contains control characters")


def _port(text: str, *, allow_zero: bool = False) -> int:
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"bad port {text!r}")
    port = int(text)
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return port


def _parse_info(info: AsyncServiceInfo) -> Announcement | None:
    if info.type != SERVICE_TYPE:
        return None
    props: dict[str, str] = {}
    for raw_key, raw_value in info.properties.items():
        if not isinstance(raw_key, bytes) or not isinstance(raw_value, bytes):
            return None
        props[raw_key.decode("utf-8")] = raw_value.decode("utf-8")
    required = ("id", "swarm", "grpc", "http", "algo", "fp", "proto", "boot")
    if any(k not in props for k in required):
        return None
    txt = {k: props[k] for k in required}
    try:
        _check_fields(txt)
        grpc_port = _port(txt["grpc"])
        http_port = _port(txt["http"], allow_zero=True)
        if not _DIGITS.fullmatch(txt["proto"]):
            return None
    except ValueError:
        return None
    # The instance name is derived from the node id: a record that claims an id
    # under another instance name is foreign (or an impersonation attempt).
    if info.name.lower() != service_name(txt["id"]).lower():
        return None
    host = _pick_address(info.parsed_addresses(IPVersion.V4Only))
    if host is None:
        return None
    return Announcement(
        node_id=txt["id"],
        swarm=txt["swarm"],
        host=host,
        grpc_port=grpc_port,
        http_port=http_port,
        algorithm=txt["algo"],
        fingerprint=txt["fp"],
        protocol_version=int(txt["proto"]),
        boot_id=txt["boot"],
    )


def _pick_address(addresses: list[str]) -> str | None:
    """First usable IPv4 address, preferring non-loopback ones."""
    usable = []
    for a in addresses:
        ip = ipaddress.IPv4Address(a)
        if not (ip.is_unspecified or ip.is_multicast):
            usable.append(ip)
    usable.sort(key=lambda ip: ip.is_loopback)  # stable: keeps announced order
    return str(usable[0]) if usable else None


# --------------------------------------------------------------------------- #
# Names and interfaces
# --------------------------------------------------------------------------- #


def _safe_label(text: str, bad: re.Pattern[str], limit: int) -> str:
    """A DNS label from ``text``; if it had to change, a hash keeps it unique."""
    clean = bad.sub("-", text)
    if clean == text and 0 < len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{clean[: limit - 9].strip('-') or 'node'}-{digest}"


def service_name(node_id: str) -> str:
    """The DNS-SD instance name of a node: its id as one label ≤ 63 bytes.

    Characters other than ``[A-Za-z0-9_-]`` become ``-``; an id that had to be
    changed or shortened gets an 8-hex hash of the original appended, so two
    different ids never share an instance name by accident.
    """
    return f"{_safe_label(node_id, _INSTANCE_BAD, MAX_LABEL_BYTES)}.{SERVICE_TYPE}"


def _server_name(node_id: str, boot_id: str) -> str:
    boot = _HOST_BAD.sub("", boot_id.lower())[:8] or hashlib.sha256(boot_id.encode()).hexdigest()[:8]
    label = _safe_label(node_id.lower(), _HOST_BAD, MAX_LABEL_BYTES - 9)
    return f"{label}-{boot}.local."


def mdns_interfaces(bind_host: str) -> list[str] | InterfaceChoice:
    """The interfaces to announce and listen on for a node serving on ``bind_host``.

    ``127.0.0.1``/``localhost`` → loopback only; a specific IPv4 address → that
    interface only; ``0.0.0.0`` → ``InterfaceChoice.All`` — only for containers,
    where the operator explicitly asked to serve on all interfaces. Anything
    else (IPv6, host names) raises ValueError: mDNS here is IPv4 only, and a
    host name would need a DNS lookup to know the interface.
    """
    host = bind_host.strip()
    if host.lower() == "localhost":
        return ["127.0.0.1"]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"mDNS needs the IPv4 address the node serves on, got {bind_host!r}; "
            "use --host with an IPv4 address (or 127.0.0.1 / 0.0.0.0)"
        ) from None
    if ip.version != 4:
        raise ValueError(f"mDNS discovery is IPv4 only; cannot announce on {bind_host!r}")
    if ip.is_unspecified:
        return InterfaceChoice.All
    if ip.is_multicast:
        raise ValueError(f"cannot announce mDNS on multicast address {bind_host!r}")
    return [str(ip)]


def _announced_addresses(host: str) -> list[str]:
    host = host.strip()
    if host.lower() == "localhost":
        return ["127.0.0.1"]
    ip = ipaddress.ip_address(host)
    if ip.version != 4:
        raise ValueError(f"the announced host must be an IPv4 address, got {host!r}")
    if not ip.is_unspecified:
        return [str(ip)]
    from zeroconf._utils.net import get_all_addresses  # only for the explicit 0.0.0.0 case

    addrs = [a for a in get_all_addresses() if not ipaddress.IPv4Address(a).is_loopback]
    return addrs or ["127.0.0.1"]


def parse_peer(spec: str) -> tuple[str, int]:
    """Parse a static peer ``HOST:PORT`` or ``[IPv6]:PORT``; ports 1..65535.

    Returns ``(host, port)`` with the brackets of an IPv6 host removed.
    """
    if not isinstance(spec, str) or not spec or spec != spec.strip():
        raise ValueError(f"peer {spec!r}: expected HOST:PORT without spaces")
    if spec.startswith("["):
        end = spec.find("]")
        if end < 0 or not spec[end + 1 :].startswith(":"):
            raise ValueError(f"peer {spec!r}: expected [IPv6]:PORT")
        host, port_text = spec[1:end], spec[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"peer {spec!r}: {host!r} inside brackets is not an IPv6 address") from None
    else:
        host, sep, port_text = spec.rpartition(":")
        if not sep:
            raise ValueError(f"peer {spec!r}: missing ':PORT' (expected HOST:PORT)")
        if ":" in host:
            raise ValueError(f"peer {spec!r}: write IPv6 addresses in brackets, e.g. [::1]:50051")
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"peer {spec!r}: {host!r} is not a valid host name or IPv4 address")
    if not _DIGITS.fullmatch(port_text):
        raise ValueError(f"peer {spec!r}: port {port_text!r} is not a number in 1..65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"peer {spec!r}: port {port} is out of range 1..65535")
    return host, port


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
        self._server = _server_name(me.node_id, me.boot_id)
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._started = False
        self._closing = False
        self._peers: dict[str, Announcement] = {}  # instance name (lower) -> last reported
        self._resolving: dict[str, asyncio.Task[None]] = {}

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
        task.add_done_callback(lambda t, k=key: self._resolving.pop(k, None) if self._resolving.get(k) is t else None)

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
