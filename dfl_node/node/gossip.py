"""The membership's gossip queue: what a node piggybacks on its probes and acks, and for how long.

memberlist's ``TransmitLimitedQueue``: each update is sent ``retransmit_mult · ⌈log10(N + 1)⌉`` times (N: the
members this node knows), so that it reaches every member in O(log N) periods with high probability, and then
dropped; a message carries at most ``per_message`` updates, those sent least often first (news before
repeats). A newer update about a member replaces the one queued about it. The queue keeps at most ``capacity``
updates (the most repeated go first): a node's memory and its messages stay bounded however many members change
at once (a thousand nodes starting together); a member whose news was dropped here is still learned by the
periodic push-pull (:class:`~dfl_node.node.swim.Swim`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from dfl_node.peering.messages import MemberUpdate


@dataclass
class _Queued:
    update: MemberUpdate
    sent: int  # how many messages carried it
    order: int  # when it was queued: among equally sent updates, the newest go first


class Gossip:
    def __init__(self, retransmit_mult: int, per_message: int, capacity: int) -> None:
        self.retransmit_mult, self.per_message, self.capacity = retransmit_mult, per_message, capacity
        self._queued: dict[str, _Queued] = {}  # by member id
        self._added = 0

    def __len__(self) -> int:
        return len(self._queued)

    def limit(self, members: int) -> int:
        """How many times an update is sent in a fleet of ``members``."""
        return self.retransmit_mult * math.ceil(math.log10(members + 1))

    def add(self, update: MemberUpdate) -> None:
        """Queue ``update`` (replacing whatever was queued about its member)."""
        self._added += 1
        self._queued[update.node_id] = _Queued(update, 0, self._added)
        if len(self._queued) > self.capacity:
            worst = max(self._queued.values(), key=lambda q: (q.sent, -q.order))
            del self._queued[worst.update.node_id]

    def take(self, members: int) -> list[MemberUpdate]:
        """The updates for one message, each counted as sent once more, and dropped once sent :meth:`limit`
        times."""
        chosen = heapq.nsmallest(self.per_message, self._queued.values(), key=lambda q: (q.sent, -q.order))
        limit = self.limit(members)
        for queued in chosen:
            queued.sent += 1
            if queued.sent >= limit:
                del self._queued[queued.update.node_id]
        return [q.update for q in chosen]
