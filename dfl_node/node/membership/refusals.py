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
from typing import Literal

from dfl_node.node.core.clock import Clock
from dfl_node.node.core.logs import RateLimitedLog
from dfl_node.peering.messages import Hello
from dfl_node.records.refusals import RefusedPeer

log = logging.getLogger(__name__)

MAX_REFUSED = 32
LOG_BUDGET, LOG_WINDOW = 10, 60.0  # at most this many lines about newly refused peers in a window of seconds
ISOLATED_LOG_INTERVAL = 60.0  # seconds between two WARNINGs that a node has no compatible peer
Side = Literal["us", "peer"]


class Refusals:
    """The refused peers of one node. ``event(peer, detail)``: a first refusal, for the node's recent events (the
    fleet page's "Recent"); ``grace``: how long after the first heartbeat a node may still be finding its peers."""

    def __init__(self, node_id: str, clock: Clock, event: Callable[[str, str], None], grace: float) -> None:
        self.node_id, self.clock, self.event, self.grace = node_id, clock, event, grace
        self._entries: dict[tuple[str, str, Side], RefusedPeer] = {}
        self._isolated = RateLimitedLog(log, clock.monotonic, interval=ISOLATED_LOG_INTERVAL)
        self._first_beat: float | None = None
        self._window: tuple[float, int] = (-LOG_WINDOW, 0)  # (start, lines logged in it)
        self._left_out = 0  # newly refused peers not logged since the last line (over the budget)

    def record(self, peer: Hello, address: str, reason: str, detail: str, by: Side) -> None:
        """A refusal at Hello of ``peer`` (seen at ``address``): kept, and logged the first time."""
        peer_id, now = peer.node_id[:64], self.clock.wall()
        key = (peer_id, reason, by)
        view, new = self._entries.get(key), key not in self._entries
        if view is None:
            if len(self._entries) >= MAX_REFUSED:
                del self._entries[min(self._entries, key=lambda k: self._entries[k].last)]
            view = self._entries[key] = RefusedPeer(id=peer_id, address="", reason=reason, by=by, since=now, last=now)
        view.address, view.detail, view.last = (peer.grpc_address or address)[:100], detail[:300], now
        view.http_port, view.status_url = peer.http_port or None, peer.status_url[:200] or None
        if new:
            self.event(peer_id, f"{reason} at hello ({'by us' if by == 'us' else 'by the peer'})")
            self._log_new(view)

    def _log_new(self, view: RefusedPeer) -> None:
        """One WARNING per newly refused peer, at most :data:`LOG_BUDGET` a minute (a flood of Hellos with new ids
        is not a flood of lines): those over it are counted, and the next line says how many."""
        now = self.clock.monotonic()
        start, lines = self._window
        if now - start >= LOG_WINDOW:
            start, lines = now, 0
        if lines >= LOG_BUDGET:
            self._window, self._left_out = (start, lines), self._left_out + 1
            return
        self._window = (start, lines + 1)
        left_out, self._left_out = self._left_out, 0
        more = f"; {left_out} more refused peers were not logged (refused_peers in /status)" if left_out else ""
        who = f"{view.id} ({view.address})"
        message = "%s refused %s at hello: %s (%s)%s" if view.by == "us" else "%s was refused by %s at hello: %s (%s)%s"
        log.warning(message, self.node_id, who, view.reason, view.detail or "no detail", more)

    def compatible(self, peer_id: str) -> None:
        """``peer_id`` answered as a compatible peer: whatever refused it before is mended."""
        mended = [key for key in self._entries if key[0] == peer_id]
        for key in mended:
            del self._entries[key]
        if mended:
            log.info("%s: peer %s is compatible now", self.node_id, peer_id)

    def views(self) -> list[RefusedPeer]:
        """What ``/status`` shows, by peer id, then reason."""
        return [view.model_copy() for _, view in sorted(self._entries.items())]

    def warn_if_isolated(self, alive_peers: int) -> None:
        """At a heartbeat: a node with no live peer that refused, or was refused by, every peer it heard of
        says so (once its first ``grace`` seconds are over), naming the peers and reasons."""
        now = self.clock.monotonic()
        self._first_beat = now if self._first_beat is None else self._first_beat
        if alive_peers or not self._entries or now - self._first_beat < self.grace:
            return
        reasons = sorted({f"{v.id} ({v.reason})" for v in self._entries.values()})
        self._isolated.warning("isolated", "%s has no compatible peer: every peer it heard of was refused at hello: "
                               "%s; see refused_peers in /status", self.node_id, ", ".join(reasons[:8]))
