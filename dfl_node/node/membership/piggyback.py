"""The membership's gossip queue: what a node piggybacks on its probes and acks, and for how long.

memberlist's ``TransmitLimitedQueue``: each update is sent ``retransmit_mult · ⌈log10(N + 1)⌉`` times (N: the
members this node knows), so that it reaches every member in O(log N) periods with high probability, and then
dropped; a message carries at most ``per_message`` updates, those sent least often first (news before
repeats). A newer update about a member replaces the one queued about it. The queue keeps at most ``capacity``
updates (the most repeated go first): a node's memory and its messages stay bounded however many members change
at once (a thousand nodes starting together); a member whose news was dropped here is still learned by the
periodic push-pull (:class:`~dfl_node.node.membership.swim.Swim`).

Every message takes from the queue, and at a thousand members it holds hundreds of updates for minutes after a
start, so the next to send (fewest sends, newest first) is the top of a heap (memberlist keeps a B-tree for the same
reason), each entry stamped with the send count it was filed under, a stale one (sent since, or replaced) skipped
when it surfaces: a take costs O(per_message · log n), not O(n). The first to drop (most sends, oldest first) is the
top of another heap, built when a full queue needs it and kept while only adds follow (a take reorders it). What
either picks is what a full sort would pick (the keys are unique: ``order`` is).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from dfl_node.peering.messages import MemberUpdate


@dataclass(eq=False)
class _Queued:
    update: MemberUpdate
    sent: int  # how many messages carried it
    order: int  # when it was queued: among equally sent updates, the newest go first


class PiggybackQueue:
    def __init__(self, retransmit_mult: int, per_message: int, capacity: int) -> None:
        self.retransmit_mult, self.per_message, self.capacity = retransmit_mult, per_message, capacity
        self._queued: dict[str, _Queued] = {}  # by member id
        self._added = 0
        self._next: list[tuple[int, int, _Queued]] = []  # (sent, -order): the next to send first
        self._drop: list[tuple[int, int, _Queued]] | None = None  # (-sent, order): the first to drop first

    def __len__(self) -> int:
        return len(self._queued)

    def limit(self, members: int) -> int:
        """How many times an update is sent in a fleet of ``members``."""
        return self.retransmit_mult * math.ceil(math.log10(members + 1))

    def _live(self, queued: _Queued, sent: int) -> bool:
        """Whether a heap entry filed at ``sent`` sends is still what is queued."""
        return queued.sent == sent and self._queued.get(queued.update.node_id) is queued

    def _compact(self) -> None:
        """Rebuild the heaps from what is queued once they hold mostly stale entries (memory stays O(n))."""
        if len(self._next) > 4 * len(self._queued) + 64:
            self._next = [(q.sent, -q.order, q) for q in self._queued.values()]
            heapq.heapify(self._next)
        if self._drop is not None and len(self._drop) > 4 * len(self._queued) + 64:
            self._drop = None

    def _evict(self) -> None:
        """Drop the most sent (oldest among equals) while the queue is over its capacity."""
        if self._drop is None:
            self._drop = [(-q.sent, q.order, q) for q in self._queued.values()]
            heapq.heapify(self._drop)
        while len(self._queued) > self.capacity:
            minus_sent, _, worst = heapq.heappop(self._drop)
            if self._live(worst, -minus_sent):
                del self._queued[worst.update.node_id]

    def add(self, update: MemberUpdate) -> None:
        """Queue ``update`` (replacing whatever was queued about its member)."""
        self._added += 1
        self._queued[update.node_id] = queued = _Queued(update, 0, self._added)
        heapq.heappush(self._next, (0, -queued.order, queued))
        if self._drop is not None:
            heapq.heappush(self._drop, (0, queued.order, queued))
        if len(self._queued) > self.capacity:
            self._evict()
        self._compact()

    def take(self, members: int) -> list[MemberUpdate]:
        """The updates for one message, each counted as sent once more, and dropped once sent :meth:`limit`
        times."""
        chosen: list[_Queued] = []
        while self._next and len(chosen) < self.per_message:
            sent, _, queued = heapq.heappop(self._next)
            if self._live(queued, sent):
                chosen.append(queued)
        limit = self.limit(members)
        for queued in chosen:
            queued.sent += 1
            if queued.sent >= limit:
                del self._queued[queued.update.node_id]
            else:
                heapq.heappush(self._next, (queued.sent, -queued.order, queued))
        self._drop = None  # sends changed: the drop order is rebuilt when next needed
        self._compact()
        return [q.update for q in chosen]
