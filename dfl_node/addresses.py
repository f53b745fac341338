"""Addresses as an operator writes them: a peer's ``HOST:PORT``, and whether a host is reachable from this machine
only. Pure parsing, no socket and no resolver: the settings check them as they are read, the network dials them.
"""

from __future__ import annotations

import functools
import ipaddress
import re

_DIGITS = re.compile(r"[0-9]{1,5}")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine: 127.0.0.0/8, ::1 or ``localhost``. Any other
    name counts as reachable from the network (we do not resolve it to find out)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_peer(spec: str) -> tuple[str, int]:
    """Parse a static peer ``HOST:PORT`` or ``[IPv6]:PORT``; ports 1..65535.

    Returns ``(host, port)`` with the brackets of an IPv6 host removed.
    """
    if not isinstance(spec, str) or not spec or spec != spec.strip():
        raise ValueError(f"peer {spec!r}: expected HOST:PORT without spaces")
    return _parsed(spec)


@functools.lru_cache(maxsize=4096)  # a simulated fleet of a thousand nodes, each listing the others: a million
def _parsed(spec: str) -> tuple[str, int]:
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
