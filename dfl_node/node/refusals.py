"""Peers refused at Hello, kept where an operator looks: ``/status`` (``refused_peers``), the fleet page and
``dfl-node status --all``.

A peer with another model, other data (a 5-feature device among 6-feature ones), another algorithm, or a model
or algorithm not installed here never joins the fleet; before, that showed only as a log line of the node that
refused it, while both nodes said "ok". Here each refusal is kept per peer, reason and side — ``us`` (this node
refused the peer's Hello or reply) or ``peer`` (the peer's reply refused us) — logged at WARNING the first time
(not at every heartbeat), and dropped once the peer enters the table as compatible. A node whose every peer was
refused says so at WARNING, at most once a minute (:meth:`Refusals.warn_if_isolated`).

Bounded: at most :data:`MAX_REFUSED` entries (the oldest go first), and every string a peer sent is cut short.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dfl_node.api.schemas import RefusedPeer
from dfl_node.node.clock import Clock
from dfl_node.node.logs import RateLimitedLog
from dfl_node.peering.messages import Hello

log = logging.getLogger(__name__)

MAX_REFUSED = 32
ISOLATED_LOG_INTERVAL = 60.0  # seconds between two WARNINGs that a node has no compatible peer
Side = Literal["us", "peer"]


@dataclass
class _Entry:
    view: RefusedPeer
    logged: bool = False


class Refusals:
    """The refused peers of one node. ``event(peer, detail)``: a first refusal, for the node's recent events (the
    fleet page's "Recent"); ``grace``: how long after the first heartbeat a node may still be finding its peers."""

    def __init__(self, node_id: str, clock: Clock, event: Callable[[str, str], None], grace: float) -> None:
        self.node_id, self.clock, self.event, self.grace = node_id, clock, event, grace
        self._entries: dict[tuple[str, str, Side], _Entry] = {}
        self._log = RateLimitedLog(log, clock.monotonic)  # the first line of each new peer, at most 1 / reason / 10 s
        self._isolated = RateLimitedLog(log, clock.monotonic, interval=ISOLATED_LOG_INTERVAL)
        self._first_beat: float | None = None

    def record(self, peer: Hello, address: str, reason: str, detail: str, by: Side) -> None:
        """A refusal at Hello of ``peer`` (seen at ``address``): kept, and logged the first time."""
        peer_id, now = peer.node_id[:64], self.clock.wall()
        key = (peer_id, reason, by)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_REFUSED:
                del self._entries[min(self._entries, key=lambda k: self._entries[k].view.last)]
            entry = self._entries[key] = _Entry(RefusedPeer(id=peer_id, address=address[:100], reason=reason, by=by,
                                                            detail="", since=now, last=now))
            self.event(peer_id, f"{reason} at hello ({'by us' if by == 'us' else 'by the peer'})")
        view = entry.view
        view.address, view.detail, view.last = (peer.grpc_address or address)[:100], detail[:300], now
        view.http_port, view.status_url = peer.http_port or None, peer.status_url[:200] or None
        if not entry.logged:
            who = f"{peer_id} ({view.address})"
            entry.logged = self._log.warning(
                f"{reason} by {by}", "%s refused %s at hello: %s (%s)" if by == "us" else "%s was refused by %s at "
                "hello: %s (%s)", self.node_id, who, reason, view.detail or "no detail")

    def compatible(self, peer_id: str) -> None:
        """``peer_id`` answered as a compatible peer: whatever refused it before is mended."""
        mended = [key for key in self._entries if key[0] == peer_id]
        for key in mended:
            del self._entries[key]
        if mended:
            log.info("%s: peer %s is compatible now", self.node_id, peer_id)

    def views(self) -> list[RefusedPeer]:
        """What ``/status`` shows, by peer id, then reason."""
        return [entry.view.model_copy() for _, entry in sorted(self._entries.items())]

    def warn_if_isolated(self, alive_peers: int) -> None:
        """At a heartbeat: a node with no live peer that refused, or was refused by, every peer it heard of
        says so (once its first ``grace`` seconds are over), naming the peers and reasons."""
        now = self.clock.monotonic()
        self._first_beat = now if self._first_beat is None else self._first_beat
        if alive_peers or not self._entries or now - self._first_beat < self.grace:
            return
        reasons = sorted({f"{v.id} ({v.reason})" for v in (e.view for e in self._entries.values())})
        self._isolated.warning("isolated", "%s has no compatible peer: every peer it heard of was refused at hello: "
                               "%s; see refused_peers in /status", self.node_id, ", ".join(reasons[:8]))
