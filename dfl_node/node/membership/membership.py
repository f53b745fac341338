"""Who is in the fleet: the node's membership, one part behind a narrow interface (:class:`Members`).

Schedulers and roles read the fleet only through :class:`Members` — the live members, their profiles (what round
plans are made from), their round progress (what a lost token is regenerated from), where they serve and
whether they restarted — and wait on it. How members are found and known to live is the implementation's:
:class:`Membership` confirms a peer it is told of (a static address, mDNS, a Hello) by the Hello handshake
(:mod:`.handshake`: compatibility, authentication, refusals), keeps them in its table (:mod:`.peers`), and knows who
lives, and where each stands, by SWIM's probes and gossip (:mod:`.swim`), at a load per node that does not grow
with the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from dfl_node.algorithms.plan import NodeProfile
from dfl_node.errors import OperatorError
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.tally import Tally
from dfl_node.node.membership.handshake import Handshake
from dfl_node.node.membership.joins import Seeds
from dfl_node.node.membership.peer_record import Peer
from dfl_node.node.membership.peers import PeerTable
from dfl_node.node.membership.refusals import Refusals
from dfl_node.node.membership.swim import Swim
from dfl_node.node.membership.swim_member import DEAD
from dfl_node.peering.messages import MAX_MEMBERS, MAX_UPDATES, Hello, HelloReply, MemberUpdate, Ping, PingAck, Progress
from dfl_node.peering.port import PeerNetwork
from dfl_node.records.peers import PeerInfo
from dfl_node.records.refusals import RefusedPeer
from dfl_node.settings.node import MembershipSettings


class Members(Protocol):
    """The fleet as this node knows it, for its schedulers and roles."""

    def alive_ids(self) -> list[str]: ...  # live peers, sorted
    def dead_ids(self) -> list[str]: ...  # peers known that stopped answering (until forgotten)
    def profiles(self) -> list[NodeProfile]: ...  # this node's and its live peers', as round plans see them
    def progress(self) -> dict[str, Progress]: ...  # each live peer's round progress, as of its last word
    def address_of(self, node_id: str) -> str | None: ...  # where a peer (or this node) serves
    def incarnations(self, ids: list[str]) -> dict[str, str | None]: ...  # boot ids; None: not alive
    def work_of(self, node_id: str) -> float: ...  # seconds of computation a peer's last role took (0: unknown)
    def is_direct(self, node_id: str) -> bool: ...  # a member dialed the peer back, as it says
    async def wait_for(self, count: int) -> None: ...  # until at least ``count`` peers live
    async def wait_alive(self, ids: Collection[str], timeout: float) -> None: ...  # until those live, or timeout
    async def refresh(self) -> None: ...  # ask every peer afresh, so that progress() is not a heartbeat old


class Membership:
    """The membership of node ``node_id`` (serving at ``address()``: its own, or its slot on a relay), by Hellos:
    its Hello is ``hello()``, its profile ``profile()``; ``fingerprint_of`` gives the fingerprint a model spec has
    here. A peer that (re)joins is told to ``on_join(peer, restarted)``, one that leaves to ``on_lost(peer)``."""

    def __init__(self, node_id: str, address: Callable[[], str], settings: MembershipSettings, clock: Clock, *,
                 hello: Callable[[], Hello], profile: Callable[[], NodeProfile],
                 fingerprint_of: Callable[[str], str], network: PeerNetwork, tally: Tally,
                 on_join: Callable[[str, bool], None], on_lost: Callable[[str], None], seed: int) -> None:
        self.node_id, self.address, self.settings, self.clock = node_id, address, settings, clock
        self._profile = profile
        self.refusals = Refusals(node_id, clock, lambda peer, detail: tally.event("refusal", peer, detail),
                                 grace=settings.peer_timeout)
        serving: dict[str, str] = {}  # SWIM's, where its members serve: read by the table
        self.table = PeerTable(node_id, self.dial, clock, heartbeat=settings.heartbeat, timeout=settings.peer_timeout,
                               static=settings.peers, events=TableEvents(self, on_join, on_lost, network),
                               expiry=settings.peer_expiry, max_pending=settings.max_pending_peers, served=serving)
        self.handshake = Handshake(hello, fingerprint_of, table=self.table, refusals=self.refusals, tally=tally,
                                   network=network)
        self.swim = Swim(node_id, settings, clock, table=self.table, network=network, hello=hello,
                         compatible=lambda peer: self.handshake.incompatibility(self.swim.said(), peer) is None,
                         seed=seed, confirmed=self.table.knows, greet=self.table.confirm, serving=serving)
        self.seeds = Seeds(settings.join, first_wait=settings.heartbeat)
        self._network = network
        self._joining: set[asyncio.Task[object]] = set()  # joins under way (a task is kept until it ends)

    # ----- Members ---------------------------------------------------------------------------
    def alive_ids(self) -> list[str]:
        return self.table.alive_ids()

    def dead_ids(self) -> list[str]:
        return self.table.dead_ids()

    def profiles(self) -> list[NodeProfile]:
        return [self._profile(), *self.table.profiles()]

    def progress(self) -> dict[str, Progress]:
        return self.table.progress()

    def address_of(self, node_id: str) -> str | None:
        return self.address() if node_id == self.node_id else self.table.address_of(node_id)

    def incarnations(self, ids: list[str]) -> dict[str, str | None]:
        return self.table.incarnations(ids)

    def work_of(self, node_id: str) -> float:
        return self.table.work_of(node_id)

    async def dial(self, address: str, timeout: float) -> HelloReply | None:
        """One Hello to ``address`` (the peer table's, a member's dial-back): its compatible reply, else None."""
        return await self.handshake.probe(address, timeout)

    def is_direct(self, node_id: str) -> bool:
        return self.table.is_direct(node_id)

    async def wait_for(self, count: int) -> None:
        await self._greeting(self.table.wait_for(count),  # the members known but not confirmed that the count needs
                             lambda: (sorted(i for i, m in self.swim.members.items() if not m.confirmed),
                                      count - self.table.alive_count()))

    async def wait_alive(self, ids: Collection[str], timeout: float) -> None:
        await self._greeting(self.table.wait_alive(ids, timeout), lambda: (sorted(ids), len(ids)))

    async def _greeting(self, wait: Coroutine[Any, Any, None], wanted: Callable[[], tuple[list[str], int]]) -> None:
        """``wait`` out, greeting each period the members ``wanted()`` names, as many as it says
        (:meth:`_confirm_now`): a greeting that went unanswered — our channel to a member that has just started may
        still be in gRPC's reconnect backoff, which fails a Hello at once — is tried again a period later, not left
        to the member's probe, which may come after a holder's wait for it is over."""
        waiting = asyncio.ensure_future(wait)
        try:
            while not waiting.done():
                self._confirm_now(*wanted())
                await asyncio.wait([waiting], timeout=self.settings.heartbeat)
        finally:
            waiting.cancel()
        await waiting

    def _confirm_now(self, ids: list[str], count: int) -> None:
        """A scheduler is about to use members: up to ``count`` of ``ids`` that SWIM knows alive but this node has
        not confirmed are greeted now, not at their probe's turn (confirmation is lazy for a fleet's size, not for
        a round that waits on them), their answers awaited as long as a peer may be silent (``peer_timeout``: a
        loaded node answers late, and a plan made without a member is another fleet's plan)."""
        for node_id in ids:
            if count <= 0:
                return
            member = self.swim.members.get(node_id)
            if member is not None and not member.confirmed and member.state != DEAD and member.hello is not None:
                self._spawn(self.table.confirm(node_id, member.hello.grpc_address, self.table.timeout))
                count -= 1

    async def refresh(self) -> None:
        await self.table.refresh()

    # ----- the rest of the node ----------------------------------------------------------------
    async def run(self) -> None:
        """The probes and gossip, until cancelled: each period a static address no member serves at and a lost
        peer are greeted, the seeds are tried if due (until a join through one succeeds), and the table drops the
        long dead and the pending that never answered."""
        await self.swim.run(self._beat)

    def _beat(self) -> None:
        self.table.prune()
        self.refusals.warn_if_isolated(self.table.alive_count())
        if (address := self.table.next_unknown()) is not None:
            self._spawn(self.join(address))
        if (address := self.table.next_lost()) is not None:  # a healed partition merges again
            self._spawn(self.join(address))
        if self.seeds.due(self.clock.monotonic()):
            self._spawn(self._join_seeds())

    def moved(self) -> None:
        """This node serves at another address now (a relay's slot): its members hear it at once
        (:meth:`Swim.announce`)."""
        self._spawn(self.swim.announce())

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        self._joining.add(task := asyncio.get_running_loop().create_task(work))
        task.add_done_callback(self._joining.discard)

    async def join(self, address: str) -> bool:
        """Join the fleet through ``address``: a Hello confirms the member there, then a push-pull swaps views.
        False: no compatible member answered there."""
        reply = await self.table.probe(address)
        if reply is None or reply.node_id == self.node_id or reply.node_id not in self.table.peers:
            return False
        await self.swim.sync(reply.node_id)
        return True

    async def _join_seeds(self) -> None:
        """One try of every ``--join`` address at once; the first that let us in ends the tries for good."""
        joined = await asyncio.gather(*(self.join(address) for address in self.seeds.addresses))
        through = next((a for a, ok in zip(self.seeds.addresses, joined, strict=True) if ok), None)
        self.seeds.tried(self.clock.monotonic(), through)

    async def ping(self, request: Ping) -> PingAck:
        """A peer's membership probe (the Ping RPC): bounded, then answered by SWIM."""
        limit = MAX_MEMBERS if request.sync else MAX_UPDATES
        if len(request.updates) > limit:
            request = replace(request, updates=request.updates[:limit])
        return await self.swim.answer(request)

    def answer(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        """A peer's Hello (the Hello RPC)."""
        return self.handshake.answer(request, peer, refused)

    def found(self, address: str, node_id: str) -> None:
        """Discovery (mDNS) announced ``node_id`` at ``address``: say Hello (the network checks that identity
        there, where it can)."""
        self._network.heard(address, node_id)
        self._spawn(self.join(address))

    def lost(self, node_id: str) -> None:
        """Discovery said goodbye for ``node_id``: it left, as if its suspicion had timed out (it rejoins when it is
        heard alive under a newer incarnation, or answers a Hello)."""
        member = self.swim.members.get(node_id)
        if member is not None:
            self.swim.merge([MemberUpdate(state=DEAD, incarnation=member.incarnation, node_id=node_id,
                                          sender=self.node_id)])
        self.table.lost(node_id)

    async def greet_static(self) -> None:
        """One Hello to each static peer and each seed, answered within a heartbeat (2 s at most): a daemon's
        start-up check (a live node with our id there stops the start)."""
        await asyncio.gather(self.table.greet_static(),
                             *(self.table.probe(a, self.table.answer_within) for a in self.seeds.addresses))

    def known(self) -> list[Peer]:
        """Every peer known, alive or not (until forgotten), by id: what the fleet page shows of each."""
        return sorted(self.table.peers.values(), key=lambda p: p.id)

    def peers(self) -> list[PeerInfo]:
        return self.table.infos()

    def unreachable(self) -> list[str]:
        """The static peers our last Hello got no answer from."""
        return sorted(self.table.unreachable)

    def refused(self) -> list[RefusedPeer]:
        return self.refusals.views()

    def start_checks(self) -> contextlib.AbstractContextManager[None]:
        """While a daemon starts (:func:`dfl_node.service.run.start_up`): a live node with our id — in a Hello it
        sends us, or in its reply to ours — stops the start, by :meth:`stop_if_duplicate`, rather than being logged
        and counted as a running node (or a simulated one) does."""
        return self.handshake.starting()

    def stop_if_duplicate(self) -> None:
        """:class:`OperatorError` if another live node with our id was seen while starting."""
        if self.handshake.duplicate:
            raise OperatorError(self.handshake.duplicate)


class TableEvents:
    """What a membership does with its peer table's events (:class:`~dfl_node.node.membership.events.MembershipEvents`):
    a member confirmed alive is in SWIM's view too, and one forgotten leaves it; the node hears of joins and losses
    (``on_join``, ``on_lost``); the network closes the channel of an address nobody uses. A class of its own, not
    :class:`Membership`'s methods: ``Membership.lost`` is discovery's goodbye, which the table's is not, and
    these events are no part of what the node asks of its membership."""

    def __init__(self, membership: Membership, on_join: Callable[[str, bool], None], on_lost: Callable[[str], None],
                 network: PeerNetwork) -> None:
        self._membership = membership
        self._on_join, self._on_lost, self._network = on_join, on_lost, network

    def joined(self, peer_id: str, restarted: bool) -> None:
        self._on_join(peer_id, restarted)

    def seen(self, hello: Hello) -> None:
        self._membership.swim.seen(hello)

    def lost(self, peer_id: str) -> None:
        self._on_lost(peer_id)

    def forgotten(self, peer_id: str) -> None:
        self._membership.swim.forget(peer_id)

    def address_unused(self, address: str) -> None:
        self._network.forget(address)
