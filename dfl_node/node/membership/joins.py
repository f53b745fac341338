"""Joining a fleet: through seed addresses (``--join``), and confirming each member that gossip tells of.

A *seed* (:class:`Seeds`) is an address a member serves at, given to start from, not a member to greet forever (a
static ``--peer`` is: the membership greets one that no member serves at every period). The node tries its seeds —
a Hello, then a push-pull of whole views with whoever answered
(:meth:`~dfl_node.node.membership.membership.Membership.join`) — at start and then after doubling waits, up to
:data:`JOIN_RETRY_MAX`, until one join succeeds; from then on the membership's probes and gossip keep it in the fleet,
and a seed that is down costs nothing.

A member learned by gossip enters SWIM's view at once (it is probed, and gossiped on), but it is only a rumour until
this node's own Hello confirms it (:meth:`PeerTable.confirm <dfl_node.node.membership.peers.PeerTable.confirm>`): the
handshake checks its compatibility and, under mutual TLS or a swarm key, that it is the node it claims to be, before the
peer table — what schedulers pick from — takes it. So a member that lied about a third node cannot make us plan a round
with it, and under mTLS only nodes that prove their certificate are used. The confirmation is lazy, as SWIM's
constant load demands: it is the member's first probe from us, in one period of two at most
(:meth:`~dfl_node.node.membership.swim.Swim.probe`), so that a node told of a thousand members at once does not say a
thousand Hellos; it confirms them over the periods that follow, and the member greeted confirms us in return. The Hellos
in flight are the peer table's pending entries, bounded by ``max_pending``. A rumour that nobody serves at its address
fails its probes, is suspected and declared dead like any member, and is forgotten ``peer_expiry`` later.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

JOIN_RETRY_MAX = 60.0  # seconds: the longest wait between two tries of the seeds before the first join


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
