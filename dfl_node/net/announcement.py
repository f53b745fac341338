"""The DNS-SD record of a node, and the pure helpers around it.

What a node announces (keys ``id swarm grpc http algo fp proto boot`` in the
TXT record of a ``_dfl._tcp.local.`` service), how a received record is parsed
and validated, the instance and host names derived from a node id, which
interfaces mDNS may use for a bind address. (A static ``HOST:PORT`` peer is
parsed by :func:`dfl_node.addresses.parse_peer`.)

Why a module of its own: none of this touches the network or a running
zeroconf, so it is tested without sockets and reused without starting
discovery. The live part — registering, browsing, reporting peers — is
:class:`dfl_node.net.discovery.MdnsDiscovery`, which re-exports these names so
``from dfl_node.net.discovery import Announcement, ...`` keeps
working.

Records come from the network and may be hostile: parsing never raises, it
returns None for anything malformed or foreign.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from dataclasses import dataclass

from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncServiceInfo

__all__ = [
    "SERVICE_TYPE",
    "Announcement",
    "fingerprint_matches",
    "mdns_interfaces",
    "server_name",
    "service_name",
]

# The logger of discovery, as before this module was split out of it: enabling
# debug logging for ``dfl_node.net.discovery`` still shows unparseable records.
log = logging.getLogger("dfl_node.net.discovery")

SERVICE_TYPE = "_dfl._tcp.local."

MAX_LABEL_BYTES = 63  # DNS label limit (RFC 1035 §2.3.4)
MAX_TXT_VALUE = 200  # bytes; one TXT string is at most 255 bytes including "key="
FP_TXT_MAX = 64  # a sha256 hex digest fits whole
FP_PREFIX_LEN = 16  # longer fingerprints are announced as this prefix

_INSTANCE_BAD = re.compile(r"[^A-Za-z0-9_-]")
_HOST_BAD = re.compile(r"[^a-z0-9-]")
_DIGITS = re.compile(r"[0-9]{1,5}")


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


def server_name(node_id: str, boot_id: str) -> str:
    """The mDNS host name a node announces its address under, unique per boot."""
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
