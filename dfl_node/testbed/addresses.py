"""``HOST:PORT`` as the weak-link proxy writes an address and reads one (``[host]:port`` for IPv6): one spelling
for its command line (:mod:`dfl_node.testbed.proxy`), its logs and its thread's name."""

from __future__ import annotations

Address = tuple[str, int]


def format_address(address: Address) -> str:
    """``host:port``; ``[host]:port`` for an IPv6 host."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> Address:
    """``(host, port)`` from ``host:port`` or ``[ipv6]:port``; port 0 means any free one."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return host, int(port)
