"""Who lives, by SWIM (Das, Gupta, Motivala 2002) as HashiCorp memberlist plays it, with Lifeguard's suspicion:
a load per node that does not grow with the fleet.

Every ``heartbeat`` seconds (the *probe period*) a node probes one member — the next of its members in a shuffled
round-robin order — with a :class:`~dfl_node.peering.messages.Ping` over the peer port. No ack within
``ping_timeout``: it asks ``indirect_probes`` other members to probe it, each answering by the end of the period.
Still nothing: the member is *suspect*, and the node says so. A suspect that hears of it refutes it with a higher
incarnation number; one that does not is declared *dead* when its suspicion times out, by every node that
knows of the suspicion, after

    min = peer_timeout · max(1, log10 N),   max = suspicion_max · min,

the timeout shrinking from max towards min (logarithmically) as ``k`` = 2 other members independently confirm the
suspicion (memberlist's ``suspicion.go``: a suspicion many confirm is acted on sooner; one a lone slow prober
raises waits longer, which keeps false suspicions of a slow member from killing it).

Changes — a member alive (with its Hello: identity, profile, round progress), suspect, dead — ride on the pings
and acks (:mod:`.gossip`: a bounded number a message, each sent ``retransmit_mult · ⌈log10(N + 1)⌉`` times), and
every message also carries its sender's own state, which it re-announces under a new incarnation whenever its
Hello changes (its round progress, its role): a node's progress reaches every member in O(log N) periods. A push-
pull of whole views, with the member a node joins through (a static or discovered address its Hello confirmed) and
every ``sync_interval`` seconds (scaled up beyond 32 members, as memberlist does) with a random member, makes sure
that a node learns the members whose news it missed.

Its bounds (how soon a crash, a restart, a newcomer is known everywhere): :mod:`.swim_bounds`; what it knows of each
member, and which updates it takes: :mod:`.swim_member`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterable

from dfl_node.node.core.clock import Clock
from dfl_node.node.membership.peers import PeerTable
from dfl_node.node.membership.piggyback import PiggybackQueue
from dfl_node.node.membership.swim_bounds import suspicion_timeouts, sync_interval
from dfl_node.node.membership.swim_member import ALIVE, DEAD, RANK, SUSPECT, Member, plain, valid
from dfl_node.peering.errors import PeerUnauthenticated, PeerUnreachable
from dfl_node.peering.messages import MAX_MEMBERS, MAX_UPDATES, Hello, MemberUpdate, Ping, PingAck
from dfl_node.peering.port import PeerNetwork
from dfl_node.settings.node import MembershipSettings

log = logging.getLogger(__name__)

CONFIRMATIONS = 2  # k: independent suspicions that bring the timeout down to its minimum (memberlist: mult − 2)
ANNOUNCE_TO = 8  # members a node that moved tells at once (the rest hear it by gossip)
PER_MESSAGE = 8  # updates of gossip a message carries besides its sender's own (MAX_UPDATES bounds what we take)


Listener = Callable[[str, str, float, str], None]  # (member, its new state here, the loop's time, who said so)


class Swim:
    """The failure detector and gossip of node ``node_id``, whose own Hello is ``hello()``. Every member gossip tells
    of that is ``compatible`` with us (the Hello checks) enters the view at once, as SWIM has it; the peer table
    (``table``: what schedulers pick from) takes it only once ``confirmed`` (a Hello of ours answered by this boot at
    this address, :mod:`.joins`). The first probe of an unconfirmed member is that Hello, ``greet(node_id, address,
    timeout)`` (None: none went), in one period of two at most: the confirmations ride on the probes."""

    def __init__(self, node_id: str, settings: MembershipSettings, clock: Clock, *, table: PeerTable,
                 network: PeerNetwork, hello: Callable[[], Hello], compatible: Callable[[Hello], bool],
                 seed: int, confirmed: Callable[[Hello], bool] = lambda hello: True,
                 greet: Callable[[str, str, float], Awaitable[bool | None]] | None = None,
                 serving: dict[str, str] | None = None) -> None:
        self.node_id, self.settings, self.clock = node_id, settings, clock
        self.table, self.network, self._hello, self._compatible = table, network, hello, compatible
        self._confirmed, self._greet = confirmed, greet
        self.rng = random.Random(seed)
        self.incarnation = int(clock.wall() * 1000)  # a restarted node starts above what its last boot said
        self.members: dict[str, Member] = {}
        # where each member serves -> its id (the static addresses it covers; the table reads it)
        self.serving: dict[str, str] = serving if serving is not None else {}
        self.gossip = PiggybackQueue(settings.retransmit_mult, PER_MESSAGE, capacity=1024)
        self.invalid = 0  # malformed updates peers sent us, dropped
        self.listeners: list[Listener] = []  # told of every change of a member's state here (the simulator's figures)
        self._announced: Hello | None = None
        self._said: MemberUpdate | None = None  # our state as we last said it
        self._order: list[str] = []  # the probe round robin
        self._synced_at = 0.0
        self._suspects: set[str] = set()  # the members suspect now (their suspicions time out: :meth:`expire`)
        self._ghosts: set[str] = set()  # unconfirmed members declared dead (forgotten after ``peer_expiry``)
        self._period = self._greeted_in = 0  # probe periods so far; the last in which a probe was a Hello
        self._greetings: set[asyncio.Future[bool | None]] = set()  # a small fleet's confirmations under way

    # ----- what this node says --------------------------------------------------------------
    def own(self) -> MemberUpdate:
        """Our own state: a new incarnation, gossiped, whenever our Hello changed since we last said it."""
        hello = plain(self._hello())
        if self._said is None or (hello is not self._announced and hello != self._announced):
            if self._announced is not None:
                self.incarnation += 1
            self._announced = hello
            self._said = MemberUpdate(state=ALIVE, incarnation=self.incarnation, node_id=self.node_id, hello=hello)
            self.gossip.add(self._said)
        return self._said  # the same object while nothing changed: the simulator sizes it once

    def said(self) -> Hello:
        """Our Hello as our last message said it (now if none went yet): what a member we learn of is checked
        against. The identity the checks read does not change while a node runs; the progress a Hello also carries
        changes each round, and building it afresh for each of a thousand members learned at a start is what this
        spares."""
        return self._announced if self._announced is not None else plain(self._hello())

    def _updates(self) -> tuple[MemberUpdate, ...]:
        return (self.own(), *self.gossip.take(len(self.members) + 1))

    def view(self, besides: Iterable[MemberUpdate] = ()) -> tuple[MemberUpdate, ...]:
        """Our view, for a push-pull: ourselves and every member not forgotten, less what ``besides`` (the asker's
        view, merged first) says of a member at the incarnation and state we hold. So a push-pull's answer carries
        only what the asker lacks: at a fleet's start, a thousand nodes that each miss a few members push-pull every
        period, and whole views both ways would move a thousand members each time (anti-entropy that answers a
        digest with its deltas: van Renesse et al., *Efficient Reconciliation and Flow Control for Anti-Entropy
        Protocols*, 2008)."""
        held = {update.node_id: update for update in besides}
        known = []
        for node_id, member in self.members.items():  # in the order we learned them: a node's view is its own
            if member.state == ALIVE and member.hello is None:
                continue
            said = member.view(node_id, self.node_id)
            theirs = held.get(node_id)
            if theirs is None or theirs.incarnation != said.incarnation or theirs.state != said.state:
                known.append(said)
        return (self.own(), *known[: MAX_MEMBERS - 1])

    # ----- what it hears --------------------------------------------------------------------
    def seen(self, hello: Hello) -> None:
        """A member the Hello handshake confirmed (alive now, whatever its incarnation said)."""
        new = hello.node_id not in self.members
        member = self.members.setdefault(hello.node_id, Member())
        self._serves(hello.node_id, member, plain(hello))
        member.said, member.confirmed = None, True
        if new or member.state != ALIVE:
            self._set(hello.node_id, member, ALIVE, hello.node_id)

    def _serves(self, node_id: str, member: Member, hello: Hello) -> None:
        """``node_id`` serves where ``hello`` says (:attr:`serving`, which the table's static greetings skip): a new
        member, or one that moved (to another relay's slot)."""
        if member.hello is not None and member.hello.grpc_address == hello.grpc_address:
            member.hello = hello
            return
        self._unserve(node_id, member)
        member.hello = hello
        self.serving[hello.grpc_address] = node_id
        self.network.heard(hello.grpc_address, node_id)  # mTLS: the id to check there (a relay's slot names no host)

    def _unserve(self, node_id: str, member: Member) -> None:
        if member.hello is not None and self.serving.get(member.hello.grpc_address) == node_id:
            del self.serving[member.hello.grpc_address]
            self.table.reconsider()

    def merge(self, updates: Iterable[MemberUpdate], *, spread: bool = True) -> None:
        """Take what a peer told us (``spread``: gossip it on; a push-pull's view is not). A member alive at an
        incarnation we already hold is passed over first: most of a push-pull's view (a thousand members), and
        dropped whatever else it says."""
        members = self.members
        for update in updates:
            member = members.get(update.node_id)
            if (member is not None and update.state == ALIVE and member.hello is not None
                    and update.incarnation <= member.incarnation):
                continue
            if not valid(update):
                self.invalid += 1
                log.debug("%s: membership update about %r dropped (malformed)", self.node_id, update.node_id[:64])
            elif update.node_id == self.node_id:
                self._about_us(update)
            elif update.state == ALIVE:
                self._alive(update, spread)
            elif update.state in (SUSPECT, DEAD):
                self._bad_news(update, spread)

    def _about_us(self, update: MemberUpdate) -> None:
        """Refute a suspicion (or a death) of ourselves with an incarnation above it."""
        if update.state != ALIVE and update.incarnation >= self.incarnation:
            self.incarnation = update.incarnation + 1
            self._announced = self._said = None
            log.info("%s: refuting %s %s (incarnation %d)", self.node_id, update.sender[:64], update.state,
                     self.incarnation)
            self.own()

    def _alive(self, update: MemberUpdate, spread: bool) -> None:
        hello, member = update.hello, self.members.get(update.node_id)
        if member is not None and (update.incarnation < member.incarnation
                                   or (update.incarnation == member.incarnation and member.hello is not None)):
            return
        if hello.node_id != update.node_id or not hello.grpc_address or not self._compatible(hello):
            return
        if member is None:
            member = self.members[update.node_id] = Member()
        self._serves(update.node_id, member, hello)
        member.incarnation, member.said, member.confirmed = update.incarnation, update, self._confirmed(hello)
        self._ghosts.discard(update.node_id)
        self._set(update.node_id, member, ALIVE, update.node_id)
        if member.confirmed:
            self.table.seen(hello)
        elif self._greet is not None and not self.table.large_fleet():  # a small fleet confirms at once
            greeting = asyncio.ensure_future(self._greet(update.node_id, hello.grpc_address, self.table.timeout))
            self._greetings.add(greeting)
            greeting.add_done_callback(self._greetings.discard)
        if spread:
            self.gossip.add(update)

    def _bad_news(self, update: MemberUpdate, spread: bool) -> None:
        member = self.members.get(update.node_id)
        if member is None or update.incarnation < member.incarnation or member.state == DEAD:
            return
        now = self.clock.monotonic()
        if update.state == SUSPECT and member.state == SUSPECT and update.incarnation == member.incarnation:
            if update.sender and update.sender not in member.suspecters:  # a new confirmation: gossip it on
                member.suspecters.add(update.sender)
                if spread:
                    self.gossip.add(update)
            return
        if update.incarnation == member.incarnation and RANK[update.state] <= RANK[member.state]:
            return
        member.incarnation = update.incarnation
        if update.state == SUSPECT:
            member.suspected_at, member.suspecters = now, {update.sender} if update.sender else set()
        self._set(update.node_id, member, update.state, update.sender)
        if spread:
            self.gossip.add(update)

    def _set(self, node_id: str, member: Member, state: str, origin: str) -> None:
        member.state = state
        if state == SUSPECT:
            self._suspects.add(node_id)
        else:
            self._suspects.discard(node_id)
        if state == DEAD:
            member.died_at = self.clock.monotonic()
            self.table.lost(node_id)
            if not member.confirmed:
                self._ghosts.add(node_id)
        if self.listeners:  # the time read once for all (a thousand members learned at a start, each told)
            now = self.clock.monotonic()
            for listener in self.listeners:
                listener(node_id, state, now, origin)

    # ----- the probes --------------------------------------------------------------------------
    def _next_target(self) -> str | None:
        while self._order:
            node_id = self._order.pop()
            member = self.members.get(node_id)
            if member is not None and member.state != DEAD and member.hello is not None:
                return node_id
        self._order = sorted(i for i, m in self.members.items() if m.state != DEAD)
        self.rng.shuffle(self._order)
        return self._order.pop() if self._order else None

    async def _ping(self, address: str, ping: Ping, timeout: float) -> PingAck | None:
        """One ping; the ack's gossip taken (None: no answer within ``timeout``, whatever the link does first: a
        swarm-key link may say Hello before it, which must not stretch a probe)."""
        try:
            async with asyncio.timeout(timeout):  # no task of its own, as wait_for would start: a thousand a second
                ack = await self.network.link(address).ping(ping, timeout)
        except (PeerUnreachable, PeerUnauthenticated, TimeoutError):
            return None
        self.merge(ack.updates[:MAX_MEMBERS if ping.sync else MAX_UPDATES], spread=not ping.sync)
        return ack

    async def _direct(self, node_id: str, member: Member, address: str) -> bool:
        """Whether ``node_id`` answered us directly: a ping, or, if we have not confirmed it and no probe of the last
        period was one, our Hello (``greet``), which confirms it."""
        if not member.confirmed and self._greet is not None and self._greeted_in < self._period - 1:
            self._greeted_in = self._period
            answered = await self._greet(node_id, address, self.settings.ping_timeout)
            if answered is not None:
                return answered
        ack = await self._ping(address, Ping(sender=self.node_id, updates=self._updates()), self.settings.ping_timeout)
        return ack is not None and ack.ok

    async def probe(self, node_id: str) -> bool:
        """Probe ``node_id``: directly, then through ``indirect_probes`` others; suspect it if none answers."""
        member, settings = self.members.get(node_id), self.settings
        if member is None or member.hello is None:
            return False
        address = member.hello.grpc_address
        if await self._direct(node_id, member, address):
            return True
        helpers = [i for i, m in sorted(self.members.items()) if m.state == ALIVE and m.confirmed and i != node_id]
        helpers = self.rng.sample(helpers, min(settings.indirect_probes, len(helpers)))
        wait = max(settings.heartbeat - settings.ping_timeout, settings.ping_timeout)
        asked = [Ping(sender=self.node_id, target=node_id, target_address=address, timeout_s=wait * 0.8,
                      updates=self._updates()) for _ in helpers]
        acks = await asyncio.gather(*(self._ping(a, p, wait) for h, p in zip(helpers, asked, strict=True)
                                      if (a := self.table.address_of(h)) is not None))
        if any(a is not None and a.ok for a in acks):
            return True
        member = self.members.get(node_id)
        if member is not None and member.state != DEAD:  # a suspicion, or our confirmation of one (Lifeguard)
            if member.state == ALIVE:
                log.info("%s: %s suspect (no ack, direct or through %d)", self.node_id, node_id, len(helpers))
            self.merge([MemberUpdate(state=SUSPECT, incarnation=member.incarnation, node_id=node_id,
                                     sender=self.node_id)])
        return False

    async def answer(self, ping: Ping) -> PingAck:
        """A ping: our ack (with our gossip), or, asked to probe another member, whether it answered us."""
        self.merge(ping.updates, spread=not ping.sync)
        if ping.sync:
            return PingAck(ok=True, updates=self.view(besides=ping.updates))
        if ping.target and ping.target != self.node_id:
            timeout = min(max(ping.timeout_s, 0.0), self.settings.heartbeat)
            ack = await self._ping(ping.target_address, Ping(sender=self.node_id, updates=self._updates()), timeout)
            return PingAck(ok=ack is not None and ack.ok, updates=self._updates())
        return PingAck(ok=True, updates=self._updates())

    async def announce(self) -> None:
        """We serve elsewhere now (a relayed node's new slot, after its relay died): our new incarnation goes at once
        to up to :data:`ANNOUNCE_TO` live members (in a fleet that small, all of them), not one a period: until it
        reaches a member, its probes of our old address fail, and a suspicion spread meanwhile must be refuted before
        its timeout, or we are declared dead. Which members: an order of our own (a hash), so the probes' random
        sequence is the same whether a node moves or not."""
        updates = self._updates()
        alive = [i for i, m in self.members.items() if m.state != DEAD and m.hello is not None]
        alive.sort(key=lambda i: hashlib.sha256(f"{self.node_id}\x1f{i}\x1f{self.incarnation}".encode()).digest())
        await asyncio.gather(*(self._ping(self.members[i].hello.grpc_address,  # type: ignore[union-attr]
                                          Ping(sender=self.node_id, updates=updates), self.settings.ping_timeout)
                               for i in alive[:ANNOUNCE_TO]))

    async def sync(self, node_id: str) -> None:
        """Push-pull: our whole view, for what of theirs we lack or hold older."""
        self._synced_at = self.clock.monotonic()
        if (address := self.table.address_of(node_id)) is not None:  # a confirmed member
            ping = Ping(sender=self.node_id, sync=True, updates=self.view())
            await self._ping(address, ping, self.settings.heartbeat)

    def expire(self) -> None:
        """Declare dead the suspects whose suspicion timed out (Lifeguard: sooner the more members confirmed it)."""
        now, n = self.clock.monotonic(), len(self.members) + 1
        low, high = suspicion_timeouts(self.settings, n)
        k = CONFIRMATIONS if n - 2 >= CONFIRMATIONS else 0
        for node_id in sorted(self._suspects):
            member = self.members[node_id]
            confirmed = max(len(member.suspecters) - 1, 0)
            timeout = low if k < 1 else max(low, high - (high - low) * math.log(confirmed + 1) / math.log(k + 1))
            if now - member.suspected_at >= timeout:
                log.info("%s: %s dead (suspect for %.1f s)", self.node_id, node_id, now - member.suspected_at)
                self.merge([MemberUpdate(state=DEAD, incarnation=member.incarnation, node_id=node_id,
                                         sender=self.node_id)])

    def forget(self, node_id: str) -> None:
        """The table forgot ``node_id`` (dead long enough), or it died unconfirmed ``peer_expiry`` ago: so do we."""
        if (member := self.members.pop(node_id, None)) is not None:
            self._unserve(node_id, member)
        self._suspects.discard(node_id)
        self._ghosts.discard(node_id)

    def _reap(self) -> None:
        """Forget the members that died before we confirmed them, ``peer_expiry`` after (the table forgets the
        confirmed): a rumour that nobody serves at its address dies out."""
        now = self.clock.monotonic()
        for node_id in [i for i in self._ghosts if now - self.members[i].died_at >= self.settings.peer_expiry]:
            self.forget(node_id)

    async def run(self, greet: Callable[[], object]) -> None:
        """A probe every period (each a task of its own, so that a slow one delays no other; a Hello to a member
        not yet confirmed, in one period of two at most), the suspicions' timeouts, ``greet()`` (a Hello to a static
        address no member serves at, and a push-pull with it: a join) and the periodic push-pulls, until
        cancelled: one exchange of our own a period, however many members a push-pull brought at once."""
        async with asyncio.TaskGroup() as tasks:
            while True:
                self._period += 1
                self.expire()
                self._reap()
                greet()
                if (target := self._next_target()) is not None:
                    tasks.create_task(self.probe(target))
                if self.clock.monotonic() - self._synced_at >= sync_interval(self.settings, len(self.members) + 1):
                    alive = sorted(i for i, m in self.members.items() if m.state == ALIVE and m.confirmed)
                    if alive:
                        tasks.create_task(self.sync(self.rng.choice(alive)))
                await asyncio.sleep(self.settings.heartbeat)
