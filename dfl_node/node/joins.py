"""Joining a fleet: through seed addresses (``--join``), and confirming each member that gossip tells of.

A *seed* (:class:`Seeds`) is an address a member serves at, given to start from, not a member to greet forever (a
static ``--peer`` is: the membership greets one that no member serves at every period). The node tries its seeds —
a Hello, then a push-pull of whole views with whoever answered (:meth:`~dfl_node.node.membership.Membership.join`)
— at start and then after doubling waits, up to :data:`JOIN_RETRY_MAX`, until one join succeeds; from then on the
membership's probes and gossip keep it in the fleet, and a seed that is down costs nothing.

A member learned by gossip (:class:`Confirmations`) is only a rumour until this node's own Hello confirms it: the
handshake checks its compatibility and, under mutual TLS or a swarm key, that it is the node it claims to be, before
the peer table — what schedulers pick from — takes it. So a member that lied about a third node cannot make us
plan a round with it, and under mTLS only nodes that prove their certificate are learned. The confirmations in
flight are the peer table's pending entries, of which they take at most half (``max_pending // 2``: a stranger's
own Hello still finds room); the members waiting for their turn are at most :data:`MAX_WAITING` (the oldest is
dropped: gossip or the next push-pull brings it again). Until confirmed, a member is neither recorded nor gossiped
on by this node, so a rumour that nobody serves at its address dies out instead of circling the fleet.
"""

from __future__ import annotations

import logging

from dfl_node.node.peers import PeerTable
from dfl_node.peering.messages import MAX_MEMBERS, Hello, MemberUpdate

log = logging.getLogger(__name__)

JOIN_RETRY_MAX = 60.0  # seconds: the longest wait between two tries of the seeds before the first join
MAX_WAITING = MAX_MEMBERS  # gossiped members waiting for our Hello (a push-pull carries at most this many)

Rumour = tuple[MemberUpdate, bool]  # what gossip said of a member not yet confirmed, and whether to spread it


class Seeds:
    """The ``--join`` addresses and when to try them next: every ``first_wait`` seconds, doubling after each try
    that no seed answered, up to :data:`JOIN_RETRY_MAX`; never again once a join succeeded."""

    def __init__(self, addresses: list[str], first_wait: float) -> None:
        self.addresses = list(addresses)
        self.joined = not addresses
        self.tries = 0
        self._wait = first_wait
        self._next = 0.0
        self._trying = False

    def due(self, now: float) -> bool:
        """Whether to try the seeds now (then the caller reports with :meth:`tried`)."""
        if self.joined or self._trying or now < self._next:
            return False
        self._trying = True
        return True

    def tried(self, now: float, through: str | None) -> None:
        """A try ended: joined ``through`` that seed, or (None) none answered, and the next try waits longer."""
        self._trying, self.tries = False, self.tries + 1
        if through is not None:
            self.joined = True
            log.info("joined the fleet through %s", through)
            return
        log.warning("join: no member answered at %s; trying again in %g s", ", ".join(self.addresses), self._wait)
        self._next = now + self._wait
        self._wait = min(2 * self._wait, JOIN_RETRY_MAX)


class Confirmations:
    """Gossiped members on their way into ``table``: each is greeted with a Hello (the table's pending entry); when
    it answers, its update is handed back (:meth:`answered`) to be merged again, now confirmed. One that does not
    answer is dropped: SWIM never recorded it nor spread it, so a rumour nobody serves dies out."""

    def __init__(self, table: PeerTable) -> None:
        self.table = table
        self.limit = max(1, table.max_pending // 2)
        self.waiting: dict[str, Rumour] = {}  # learned, not yet greeted: oldest first
        self.greeted: dict[str, Rumour] = {}  # our Hello is on its way (a pending entry of the table)

    def confirmed(self, update: MemberUpdate, spread: bool) -> bool:
        """Whether the member that ``update`` says lives is the one the table confirmed (same boot, same address);
        if not, it waits for our Hello (the newest update kept)."""
        hello, node_id = update.hello, update.node_id
        peer = self.table.peers.get(node_id)
        if peer is not None and peer.boot_id == hello.boot_id and peer.address == hello.grpc_address:
            return True
        if node_id in self.greeted:
            self.greeted[node_id] = (update, spread)
            return False
        self.waiting.pop(node_id, None)
        self.waiting[node_id] = (update, spread)
        if len(self.waiting) > MAX_WAITING:
            del self.waiting[next(iter(self.waiting))]
        self.greet()
        return False

    def greet(self) -> None:
        """Say Hello to waiting members while the confirmations in flight stay within :attr:`limit`."""
        while self.waiting and len(self.greeted) < self.limit:
            node_id = next(iter(self.waiting))
            rumour = self.waiting.pop(node_id)
            if not self.table.heard(rumour[0].hello):
                self.waiting[node_id] = rumour  # the table is full of strangers' Hellos: next period
                return
            if node_id in self.table.pending:
                self.greeted[node_id] = rumour

    def settle(self) -> None:
        """After the table's prune (each period): a greeted member whose Hello went unanswered is dropped."""
        for node_id in [i for i in self.greeted if i not in self.table.pending]:
            del self.greeted[node_id]
            log.debug("%s: gossiped member %s did not answer our Hello", self.table.self_id, node_id[:64])
        self.greet()

    def answered(self, hello: Hello) -> Rumour | None:
        """The member of ``hello`` answered (or said Hello): what gossip said of it, to merge again, if gossip said
        it of this boot at this address (an older rumour is dropped)."""
        rumour = self.greeted.pop(hello.node_id, None) or self.waiting.pop(hello.node_id, None)
        self.greet()
        if rumour is None or (rumour[0].hello.boot_id, rumour[0].hello.grpc_address) != (hello.boot_id,
                                                                                         hello.grpc_address):
            return None
        return rumour
