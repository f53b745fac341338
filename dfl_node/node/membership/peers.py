"""The peer table: who is out there, at which address, with which profile and progress, and whether they live
(each a :class:`~.peer_record.Peer`).

Peers come from mDNS, from static ``--peer`` addresses, from Hellos they send us, and from the membership's
gossip. mDNS cannot tell that a node crashed (its records linger for many minutes), so liveness is the
application's: the failure detector (:mod:`.swim`) marks a peer dead (:meth:`PeerTable.lost`), and it leaves the
round plans; it rejoins as soon as it is heard alive again (:meth:`PeerTable.seen`).

The table is bounded. A peer is *confirmed* only once it answered a Hello of ours at the address it
gave: a Hello it sends us (anyone can send one, with any id and address) makes it *pending*, at most
``max_pending`` at a time (more are refused and counted: ``peer_table_full``); a pending peer is
probed at once and dropped if it does not answer within ``timeout``: its own Hellos meanwhile get no more
Hellos of ours (a flood of them, from any address, makes this node send at most ``max_pending`` Hellos a
``timeout``), while a greeting of this node's own — a member's gossip, a holder about to use it — goes again once
the last one failed. A confirmed peer silent for ``expiry`` seconds leaves the table (and its channel is
closed, :meth:`~.events.MembershipEvents.address_unused`).

What changes is told, as it happens, to one listener (:class:`~.events.MembershipEvents`), as memberlist tells its
EventDelegate: the table's owner acts on it (:mod:`.membership`: SWIM's view, the node's rounds, the channels).

A static address is the operator's word that a node is there, so one that does not answer (its name does
not resolve, it refuses connections, it is silent) is not left in silence: it is logged at WARNING when it
first fails, then at most once a minute, listed in ``/status`` (``unreachable_peers``) until it answers,
and greeted again meanwhile (one such address a probe period: :meth:`PeerTable.next_unknown`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping

from dfl_node.algorithms.plan import NodeProfile
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.logs import RateLimitedLog
from dfl_node.node.membership.events import NO_EVENTS, MembershipEvents
from dfl_node.node.membership.peer_record import Peer
from dfl_node.peering.messages import MAX_ID, Hello, HelloReply, Progress
from dfl_node.records.peers import PeerInfo

log = logging.getLogger(__name__)

# Up to this many members a fleet confirms eagerly — a member learned is greeted at once, a stranger's Hello answered
# with ours — as a small fleet's rounds want; beyond it, lazily, at the probes' pace (:mod:`.joins`)
EAGER_FLEET = 32
UNANSWERED_LOG_INTERVAL = 60.0  # seconds between two WARNINGs about the same silent static peer

HelloFn = Callable[[str, float], Awaitable[HelloReply | None]]  # (address, timeout) -> accepted reply, or None


class PeerTable:
    def __init__(self, self_id: str, hello: HelloFn, clock: Clock, *, heartbeat: float, timeout: float,
                 static: list[str], events: MembershipEvents = NO_EVENTS, expiry: float = 300.0,
                 max_pending: int = 32, served: Mapping[str, str] | None = None) -> None:
        self.self_id = self_id
        self.events = events  # told of every change, as it happens
        self.hello = hello
        self.clock = clock
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.expiry = max(expiry, timeout)
        # how long a Hello somebody waits on (a refresh, the start's check of static peers) waits for its answer
        self.answer_within = min(heartbeat, 2.0)
        self.max_pending = max_pending
        self._static: tuple[str, ...] = ()
        # where the members the membership knows of serve -> their ids (SWIM's view, confirmed or not): static
        # addresses that need no Hello of :meth:`next_unknown`'s, and strangers' Hellos that need none in return (a
        # member's probe confirms it); its owner calls :meth:`reconsider` when it changes
        self.served: Mapping[str, str] = served if served is not None else {}
        self.unreachable: dict[str, str] = {}  # static address -> why our last Hello there got no answer
        self._silences = RateLimitedLog(log, clock.monotonic, interval=UNANSWERED_LOG_INTERVAL)
        self.peers: dict[str, Peer] = {}
        self.pending: dict[str, tuple[str, float]] = {}  # id -> (address, when first heard): not yet confirmed
        self._greeting: dict[str, str] = {}  # the pending whose Hello of ours is in flight: the address it went to
        self.changed = asyncio.Condition()
        self._greeted = 0  # where the round robin of :meth:`next_unknown` stands
        self._reconnects = 0  # and that of :meth:`next_lost`
        # Read every probe period by every node, so kept rather than recomputed from the whole table (a thousand
        # peers): the live ids (sorted), the static addresses no live peer serves at (None: to recompute, after a
        # peer left or moved), and the peers not alive (what :meth:`prune` looks at).
        self._alive: list[str] = []
        self._unknown: list[str] | None = None
        self._silent: set[str] = set()
        self._waking = False  # a wake-up of the table's waiters is scheduled and has not run yet
        self.static = static

    @property
    def static(self) -> tuple[str, ...]:
        """The static addresses (``--peer``)."""
        return self._static

    @static.setter
    def static(self, addresses: Iterable[str]) -> None:
        """Set at start (and by a test at run time): what :meth:`next_unknown` keeps is recomputed."""
        self._static = tuple(addresses)
        self._moved()

    def alive_ids(self) -> list[str]:
        return list(self._alive)

    def alive_count(self) -> int:
        return len(self._alive)

    def _moved(self) -> None:
        """A peer left, or serves elsewhere: what :meth:`next_unknown` keeps is stale."""
        self._unknown = None

    def reconsider(self) -> None:
        """A member no longer serves where it did (:attr:`served` lost an address): the static addresses to greet
        are recomputed. (One that gained an address needs nothing: :meth:`next_unknown` drops what it serves at.)"""
        self._unknown = None

    def incarnations(self, ids: list[str]) -> dict[str, str | None]:
        """Each peer's boot id, None where it is not alive: a change means it crashed, restarted or left."""
        return {i: p.boot_id if (p := self.peers.get(i)) is not None and p.alive else None for i in ids}

    def dead_ids(self) -> list[str]:
        """Peers we know that stopped answering (until they are forgotten after ``expiry``)."""
        return sorted(p.id for p in self.peers.values() if not p.alive)

    def address_of(self, peer_id: str) -> str | None:
        peer = self.peers.get(peer_id)
        return peer.address if peer else None

    def _wake(self) -> None:
        """Wake whoever waits on the table, once for all the changes made before the wake-up runs: a node learning
        a thousand peers at once wakes its waiter once, not a thousand times (each woken waiter reads the table as
        it is then, so none misses a change)."""
        if not self._waking:
            self._waking = True
            asyncio.get_running_loop().create_task(self._notify()).add_done_callback(self._woken)

    def _woken(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # cancelled before it ran: the next change wakes the waiters
            self._waking = False

    async def _notify(self) -> None:
        self._waking = False
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, count: int) -> None:
        """Until at least ``count`` peers are alive; meanwhile says how many it has, whenever that changes."""
        said = None
        async with self.changed:
            while (have := len(self.alive_ids())) < count:
                if have != said:
                    log.info("%s: waiting for peers: have %d, need %d", self.self_id, have, count)
                    said = have
                await self.changed.wait()
        if said is not None:
            log.info("%s: %d peer(s) alive; starting", self.self_id, have)

    async def wait_alive(self, ids: Collection[str], timeout: float) -> None:
        """Until every peer of ``ids`` is alive, for at most ``timeout`` (those still missing then are left out)."""
        others = set(ids) - {self.self_id}
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait_for(lambda: others <= set(self.alive_ids())), timeout)

    def seen(self, reply: Hello) -> None:
        """Record a live, compatible peer (from its Hello or its reply to ours)."""
        if reply.node_id == self.self_id or not reply.grpc_address:
            return
        now, heard_at = self.clock.wall(), self.clock.monotonic()
        self.pending.pop(reply.node_id, None)  # confirmed (its reply, or a member's gossip): no longer pending
        peer = self.peers.get(reply.node_id)
        restarted = peer is not None and peer.boot_id != reply.boot_id
        rejoined = peer is None or not peer.alive or restarted
        if peer is None or not peer.alive:
            bisect.insort(self._alive, reply.node_id)
        if peer is not None and peer.address != reply.grpc_address:
            log.info("peer %s moved to %s (from %s)", peer.id, reply.grpc_address, peer.address)
            self._moved()
        if peer is None or rejoined or peer.address != reply.grpc_address:
            self._silent.discard(reply.node_id)
        if peer is None:
            peer = self.peers[reply.node_id] = Peer(reply.node_id, reply.grpc_address, reply.http_port,
                                                    reply.boot_id, reply.algorithm, now, heard_at)
        peer.address, peer.http_port, peer.boot_id = reply.grpc_address, reply.http_port, reply.boot_id
        peer.status_url, peer.model, peer.num_samples = reply.status_url, reply.model, reply.num_samples
        peer.work_s = reply.work_s if math.isfinite(reply.work_s) and reply.work_s > 0 else 0.0  # a peer's word
        peer.relay, peer.direct = reply.relay[:MAX_ID], reply.direct
        peer.last_seen, peer.heard_at, peer.alive = now, heard_at, True
        before, peer.progress = peer.progress, reply.progress  # a request's as a reply's: both are news
        if not reply.progress.holding:
            peer.holding_since = None
        elif before is None or not before.holding or before.epoch != reply.progress.epoch:
            peer.holding_since = now
        if rejoined:
            log.info("peer %s at %s is alive", peer.id, peer.address)
            self._wake()
            self.events.joined(peer.id, restarted)
        self.events.seen(reply)

    def knows(self, hello: Hello) -> bool:
        """Whether the peer of ``hello`` is confirmed here: this boot of it, at this address."""
        peer = self.peers.get(hello.node_id)
        return peer is not None and peer.boot_id == hello.boot_id and peer.address == hello.grpc_address

    def heard(self, request: Hello) -> bool:
        """A Hello a peer sent us. A confirmed peer (same boot, same address) is alive again; a member the
        membership knows of but has not confirmed waits for its probe; anyone else is pending until it answers a
        Hello of ours (probed now). False: the pending table is full."""
        if request.node_id == self.self_id or not request.grpc_address:
            return True
        if self.knows(request):
            self.seen(request)
            return True
        if request.node_id in self.pending and self.pending[request.node_id][0] == request.grpc_address:
            return True  # greeted there already
        if (self.large_fleet() and request.node_id not in self.peers
                and self.served.get(request.grpc_address) == request.node_id):
            return True  # a large fleet's member we know of, not yet confirmed: our own probe confirms it in its turn
        if len(self.pending) >= self.max_pending and request.node_id not in self.pending:
            return False
        # pending anew where it says it serves now: a node that moved (to a relay's slot) is greeted there
        self.pending[request.node_id] = (request.grpc_address, self.clock.monotonic())
        asyncio.get_running_loop().create_task(self._greet_pending(request.node_id, request.grpc_address, self.timeout))
        return True

    def large_fleet(self) -> bool:
        """Whether this node's fleet is too large to confirm its members eagerly: more than ``EAGER_FLEET`` members
        known, or static addresses listed (a thousand nodes started together, each listing the others, know few
        members in their first periods, and greeting each at once would be a thousand Hellos a node)."""
        return max(len(self.served), len(self._static)) > EAGER_FLEET

    def lost(self, peer_id: str) -> None:
        """mDNS said goodbye (or the peer stopped answering)."""
        peer = self.peers.get(peer_id)
        if peer and peer.alive:
            peer.alive = False
            self._alive.remove(peer_id)
            self._moved()
            self._silent.add(peer_id)
            log.info("peer %s left (silent or said goodbye)", peer_id)
            self._wake()
            self.events.lost(peer_id)

    def unanswered(self, address: str, why: str) -> None:
        """Our Hello to ``address`` got no answer (``why``: "does not resolve (…)", "refuses connections", …).
        Only static addresses are reported: a discovered or pending peer that falls silent is the ordinary
        life of a fleet (it leaves the table after ``timeout``)."""
        if address not in self.static:
            return
        self.unreachable[address] = why
        self._silences.warning(f"unanswered Hellos to {address}", "static peer %s %s; retrying every %g s",
                               address, why, self.heartbeat)

    def answered(self, address: str) -> None:
        """Something answered our Hello at ``address`` (compatible or not: it is reachable)."""
        if self.unreachable.pop(address, None) is not None:
            log.info("static peer %s answers now", address)

    async def probe(self, address: str, timeout: float | None = None) -> HelloReply | None:
        """Our Hello to ``address``, answered within ``timeout``: by default as long as a peer may be silent
        (nobody waits on it: a heartbeat's, a discovered or pending peer's); :attr:`answer_within` where
        somebody does. Returns the accepted reply (None: none, or refused)."""
        reply = await self.hello(address, self.timeout if timeout is None else timeout)
        if reply is not None:
            self.pending.pop(reply.node_id, None)
            self.seen(reply)
        return reply

    async def confirm(self, node_id: str, address: str, timeout: float) -> bool | None:
        """Our Hello to ``node_id``, a member we were told of serving at ``address``, answered within ``timeout``:
        whether it answered as that node. It is pending meanwhile, so that its own Hello to us, crossing ours, is
        not answered with yet another. A pending member whose last Hello of ours failed is greeted again: that
        Hello may have failed at once although the member serves (our channel to it still in gRPC's reconnect
        backoff after its earlier silence), and taken for one still in flight it would be left out, until
        :meth:`prune` drops it ``timeout`` later, of the round a new holder plans meanwhile. A member that moved
        (a relayed member's new slot) is pending at its new address, and greeted there even while a Hello to the old
        one is in flight. None: no Hello went (one to that address is in flight already, or the pending table is
        full)."""
        if self._greeting.get(node_id) == address:
            return None
        pending = self.pending.get(node_id)
        if pending is None and len(self.pending) >= self.max_pending:
            return None
        if pending is None or pending[0] != address:
            self.pending[node_id] = (address, self.clock.monotonic())
        return await self._greet_pending(node_id, address, timeout)

    async def _greet_pending(self, node_id: str, address: str, timeout: float) -> bool:
        """Our Hello to pending ``node_id`` at ``address`` (where it is pending), answered within ``timeout``:
        whether it answered as that node. Unanswered, it stays pending until :meth:`prune`."""
        self._greeting[node_id] = address
        try:
            reply = await self.probe(address, timeout)
        finally:
            if self._greeting.get(node_id) == address:
                del self._greeting[node_id]
        return reply is not None and reply.node_id == node_id

    async def greet_static(self) -> None:
        """One Hello to each static peer, answered within :attr:`answer_within` (a daemon's start-up check)."""
        await asyncio.gather(*(self.probe(address, self.answer_within) for address in self.static))

    def _in_use(self, address: str) -> bool:
        return (address in self.static or any(p.address == address for p in self.peers.values())
                or any(a == address for a, _ in self.pending.values()))

    def prune(self) -> None:
        """Drop the long dead and the pending that never answered."""
        now = self.clock.monotonic()
        for peer in [self.peers[i] for i in sorted(self._silent)]:
            if now - peer.heard_at > self.expiry:
                del self.peers[peer.id]
                self._silent.discard(peer.id)
                log.info("peer %s forgotten (silent for %.0f s)", peer.id, now - peer.heard_at)
                self.events.forgotten(peer.id)
                if not self._in_use(peer.address):
                    self.events.address_unused(peer.address)
        for peer_id, (address, since) in list(self.pending.items()):
            if now - since > self.timeout:
                del self.pending[peer_id]
                if not self._in_use(address):
                    self.events.address_unused(address)

    def next_unknown(self) -> str | None:
        """The next static address no live peer, nor any member known, serves at (round robin): the membership
        greets one a period, so that a thousand nodes listing each other join through the first that answers and
        learn the rest by gossip, rather than saying Hello to all at once. In the list's order: the first address a
        fleet's nodes list is the one most join through at a start, and it answers with what each lacks (a seed,
        as memberlist's first join address is); in an order of each node's own, a 1,000-node start took twice as
        long to be known everywhere (8 s against 4), and more work."""
        if self._unknown is None:
            known = {p.address for p in self.peers.values() if p.alive}
            self._unknown = [a for a in self.static if a not in known and a not in self.served]
        unknown = self._unknown  # kept while peers join: those that serve at one of them are dropped here
        while unknown:
            self._greeted += 1
            at = self._greeted % len(unknown)
            if unknown[at] not in self.served:
                return unknown[at]
            del unknown[at]
        return None

    def next_lost(self) -> str | None:
        """The address of the next peer known but not alive (round robin, until it is forgotten after ``expiry``):
        the membership greets one a period, so that two halves of a fleet that declared each other dead while cut
        apart merge again once the cut heals (Serf reconnects to failed members the same way); SWIM probes only the
        live."""
        if not self._silent:
            return None
        lost = sorted(self._silent)
        self._reconnects += 1
        return self.peers[lost[self._reconnects % len(lost)]].address

    def progress(self) -> dict[str, Progress]:
        """Round mode: where each live peer stood at its last reply (those that never replied left out)."""
        return {p.id: p.progress for p in self.peers.values() if p.alive and p.progress is not None}

    async def refresh(self) -> None:
        """One Hello to every confirmed peer now, so that what :meth:`progress` says is not a heartbeat old
        (a peer that does not answer within :attr:`answer_within` keeps what it said last)."""
        peers = sorted(self.peers.values(), key=lambda p: p.id)
        await asyncio.gather(*(self.probe(p.address, self.answer_within) for p in peers))

    def is_direct(self, node_id: str) -> bool:
        """Whether live peer ``node_id`` said a member dialed it back (it can dial us back, and relay us)."""
        peer = self.peers.get(node_id)
        return peer is not None and peer.alive and peer.direct

    def work_of(self, node_id: str) -> float:
        """Seconds of computation ``node_id``'s last role took, as it said (0: unknown, or not a live peer)."""
        peer = self.peers.get(node_id)
        return peer.work_s if peer is not None and peer.alive else 0.0

    def profiles(self) -> list[NodeProfile]:
        """The live peers' profiles (architecture, sample count), as their Hellos announced them."""
        return [self.peers[p].profile() for p in self.alive_ids()]

    def infos(self) -> list[PeerInfo]:
        return [p.info() for p in sorted(self.peers.values(), key=lambda p: p.id)]
