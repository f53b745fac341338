"""Announcements for the discovery tests, shared by test_discovery.py (live) and test_announcement.py (pure).

One place for the factory so both files build records the same way: loopback
host, ids and swarms suffixed per run (concurrent runs on one loopback stay
apart), a 64-hex fingerprint and a fresh boot id unless given.
"""

from __future__ import annotations

import uuid

from dfl_node.net.announcement import Announcement

BIND = "127.0.0.1"  # never anything else in the discovery tests
RUN = uuid.uuid4().hex[:6]  # ids and swarms unique per run: concurrent runs on one loopback stay apart


def nid(name: str) -> str:
    return f"{name}-{RUN}"


def ann(node_id: str, *, swarm: str = "s1", port: int = 50051, boot: str | None = None, **kw) -> Announcement:
    fields = dict(
        node_id=nid(node_id),
        swarm=nid(swarm),
        host=BIND,
        grpc_port=port,
        http_port=port + 1000,
        algorithm="defkt",
        fingerprint=f"{abs(hash(node_id)) % 16**16:016x}" * 4,  # 64 hex
        protocol_version=1,
        boot_id=boot or uuid.uuid4().hex,
    )
    fields.update(kw)
    return Announcement(**fields)
