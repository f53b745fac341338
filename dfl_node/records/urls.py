"""Where a node's REST API is: the base URL an operator typed, and a peer's from what it announced.

Shared by ``dfl-node status`` (which queries peers) and the fleet page (which links to them).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

__all__ = ["normalize_url", "peer_url"]

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def normalize_url(url: str) -> str:
    """Base URL of a node: scheme added if missing, trailing ``/`` and ``/status`` removed."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if url.endswith("/status"):
        url = url[: -len("/status")]
    return url


def _split_host(address: str) -> str:
    """Host part of ``host:port`` (IPv6 ``[::1]:50051`` keeps its brackets)."""
    if address.startswith("["):
        return address[: address.index("]") + 1] if "]" in address else address
    if address.count(":") == 1:
        return address.rsplit(":", 1)[0]
    if address.count(":") > 1:  # bare IPv6 address without a port
        return f"[{address}]"
    return address


def peer_url(peer: dict[str, Any], base_url: str) -> str | None:
    """Status base URL of a peer, or None if it has no HTTP port.

    The URL the peer announced (``--status-url``, e.g. a published port of a container) wins;
    else ``http://{peer host}:{http_port}``, where a wildcard host is taken to be ``base_url``'s.
    """
    if peer.get("status_url"):
        return str(peer["status_url"]).rstrip("/")
    port = peer.get("http_port")
    if port is None:
        return None
    host = _split_host(str(peer.get("address", "")))
    if host in _WILDCARD_HOSTS:
        host = urlsplit(base_url).hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
    return f"http://{host}:{int(port)}"
