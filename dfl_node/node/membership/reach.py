"""Whether peers can dial this node, and if not, the relay they reach it through (:class:`Reach`).

A device behind a home router, a factory firewall or a carrier's NAT can connect out, but nobody can connect in.
So once it knows a member, a node asks members that are dialed directly (their Hellos name no relay) to dial it back
at the address it advertises (``DialBack``: one Hello, as libp2p's AutoNAT asks). If one can, peers can: it is
**direct**. If none can, it reserves a slot on one of them — its **relay** (:mod:`dfl_node.peering.relays`), chosen
by rendezvous hashing so that a fleet's relayed nodes spread over its reachable members — and advertises the slot
as its address, the relay's id in its Hello. Peers then reach it through the relay for everything: probes, Hellos,
roles, tokens, models. If the relay dies or the link to it breaks, it reserves on another; every
:data:`RECHECK_S` it asks again, so a node that becomes reachable (a port forwarded) or unreachable changes over
without a restart. ``--relay HOST:PORT`` names its relay (and uses it, asking nothing), ``--relay off`` skips the
question (the node says it is direct). A node on loopback is direct unless it names a relay: its peers are on its
machine.

A node is a relay for the members that ask, if it is direct itself and has a slot left (``--relay-slots``); the
bytes and their bounds are the network's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from dfl_node.addresses import is_loopback, parse_peer
from dfl_node.node.core.clock import Clock
from dfl_node.node.membership.membership import Members
from dfl_node.peering.errors import PeerUnreachable, TransferRefused
from dfl_node.peering.messages import Ack, DialBackRequest, HelloReply, ReserveRequest
from dfl_node.peering.port import PeerNetwork
from dfl_node.peering.relays import Reservation

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits

State = Literal["unknown", "direct", "relayed", "unreachable"]
DIAL_BACK_S = 2.0  # how long a member may take to dial us back (a member's bound: DIAL_BACK_MAX_S)
DIAL_BACK_MAX_S = 5.0  # the longest a dial-back we make for a member may take, whatever it asks
DIAL_BACK_RETRY_S = 0.5  # between two Hellos of one dial-back
DIAL_BACKS = 8  # dial-backs a node makes at once, at most: one more is answered "busy" (its caller asks another)
ASKED = 2  # members asked to dial back: one that cannot (its own link is down) must not make us relayed
RECHECK_S = 300.0  # how often a node asks again whether it is reachable
RESERVE_S = 5.0  # how long a relay may take to give a slot
FIRST_TRIED = 3  # of the addresses a node was given (join, static), those asked first, before its first Hello
FIRST_TRIES = 5  # times it asks them (a dial-back, a slot) before it says Hello anyway (reachability unknown)
RETRY_S = 2.0  # between two tries when no member can relay, or none answered
SHUNNED_S = 60.0  # a relay that was lost or refused is not asked again for this long


class Reach:
    """The reachability of node ``node_id``, which serves its peers at ``own`` (its advertised address): ``mode`` is
    ``auto``, ``off`` or a relay's ``HOST:PORT``. ``changed`` is told when :attr:`address` or :attr:`relay` change
    (the node's Hello says them)."""

    def __init__(self, node_id: str, own: str, swarm: str, mode: str, slots: int, clock: Clock,
                 network: PeerNetwork, changed: Callable[[], None]) -> None:
        self.node_id, self.own, self.swarm, self.mode, self.slots = node_id, own, swarm, mode, slots
        self.clock, self.network, self._changed = clock, network, changed
        self.address = own  # what it advertises: its own address, or its slot on a relay
        self.relay = ""  # its relay's node id ("": reached directly)
        self.state: State = "unknown"
        self.settled = asyncio.Event()  # set once it knows it is direct, or holds a slot, or found no way to know
        self._shunned: dict[str, float] = {}  # relays not to ask again before then (the node's clock)
        self._held: Reservation | None = None  # the slot it holds
        self._dialing = 0  # dial-backs it makes for members now

    def _set(self, state: State, address: str, relay: str = "") -> None:
        moved = (address, relay) != (self.address, self.relay)
        self.state, self.address, self.relay = state, address, relay
        if moved:
            self._changed()

    # ----- this node's reachability ----------------------------------------------------------
    async def run(self, members: Members, first: list[str]) -> None:
        """Find out, and keep this node reachable, until cancelled: first through ``first`` (the addresses it was
        given to join or as static peers), before it says Hello to the fleet (:attr:`settled`), so that no member
        knows it by an address nobody can dial; then through the members it learns."""
        if self.mode == "off" or (self.mode == "auto" and is_loopback(parse_peer(self.own)[0])):
            self._set("direct", self.own)
            self.settled.set()
            return
        try:
            await self._find(members, first)
        finally:  # the node stops: its slot goes back
            if self._held is not None:
                await self._held.close()

    async def _find(self, members: Members, first: list[str]) -> None:
        if self.mode != "auto":  # its relay, named: no Hello before it holds a slot there
            while True:
                named = {m: a for m in members.alive_ids() if (a := members.address_of(m)) == self.mode}
                held = await self._reserve(named or {self.mode: self.mode})
                if held is None:
                    await asyncio.sleep(RETRY_S)
                else:
                    await self._hold(held, until=None)
        given = {a: a for a in sorted(first, key=lambda a: _rank(self.node_id, a))[:FIRST_TRIED]}
        for _ in range(FIRST_TRIES if given else 0):  # a fleet starting: its relays may not know they are direct yet
            verdict = await self._direct(list(given.values()))
            if verdict or (verdict is False and await self._reserve(given) is not None):
                break
            await asyncio.sleep(RETRY_S)
        self.settled.set()  # direct, relayed, or no way to know yet: it says Hello with what it has
        await members.wait_for(1)
        await self._keep(members)

    async def _keep(self, members: Members) -> None:
        """Keep this node reachable: ask again every :data:`RECHECK_S` (sooner while no member could answer); while
        nobody can dial it, hold a slot, and when the relay is lost take one on the next relay at once."""
        behind = self._held is not None  # a member said it could not dial us: a relay, until a recheck says not
        ask_at = self.clock.monotonic() + (RECHECK_S if behind or self.state == "direct" else 0.0)
        while True:
            if self.clock.monotonic() >= ask_at:
                verdict = await self._direct(list(self._direct_members(members).values()))
                behind = behind if verdict is None else not verdict
                ask_at = self.clock.monotonic() + (RETRY_S if verdict is None and not behind else RECHECK_S)
                if verdict and self._held is not None:  # reachable now (a port forwarded): the slot goes back
                    await self._close(self._held)
            # A wait for ``ask_at`` that ends means it came, whatever the clock reads: asyncio runs a timer that falls
            # within its clock's resolution early, and a clock read a hair before ``ask_at`` spun this loop (a
            # simulated fleet of NAT nodes stood still at its first recheck).
            if not behind:
                await asyncio.sleep(max(0.0, ask_at - self.clock.monotonic()))
                ask_at = self.clock.monotonic()
            elif self._held is None and await self._reserve(self._candidates(members)) is None:
                self.state = "unreachable"
                await asyncio.sleep(RETRY_S)
            elif self._held is not None and not await self._hold(self._held, until=ask_at):
                ask_at = self.clock.monotonic()

    async def _direct(self, addresses: list[str]) -> bool | None:
        """Whether members (up to :data:`ASKED` of those at ``addresses``) can dial us back at our own address: True
        if one did (this node is direct), False if one answered that it could not, None if none answered (busy with
        other dial-backs, or out of reach itself): no evidence either way."""
        asked = sorted(addresses, key=lambda a: _rank(self.node_id, a))[:ASKED]
        request = DialBackRequest(sender=self.node_id, address=self.own, timeout_s=DIAL_BACK_S)

        async def ask(address: str) -> bool | None:
            try:
                ack = await self.network.link(address).dial_back(request, DIAL_BACK_S + 2)
            except PeerUnreachable:
                return None
            return True if ack.ok else False if ack.reason == "unreachable" else None

        answers = await asyncio.gather(*(ask(a) for a in asked))
        if True not in answers:
            return False if False in answers else None
        if self.state != "direct":
            log.info("%s: peers can dial it at %s (direct)", self.node_id, self.own)
        self._set("direct", self.own)
        self.settled.set()
        return True

    def _direct_members(self, members: Members) -> dict[str, str]:
        """The live members that say a member dialed them back, by id: their addresses. Only they are asked to dial
        us back, and for slots: a member on our own network (behind the same NAT) could dial us, and nobody else
        could reach a slot on it."""
        found = {}
        for node_id in members.alive_ids():
            address = members.address_of(node_id)
            if address is not None and members.is_direct(node_id):
                found[node_id] = address
        return found

    def _candidates(self, members: Members) -> dict[str, str]:
        """The relays to try, best first: members reached directly, by rendezvous hash, those lately lost last."""
        now = self.clock.monotonic()
        direct = self._direct_members(members)
        return {m: direct[m] for m in sorted(direct, key=lambda m: (self._shunned.get(m, 0.0) > now,
                                                                     _rank(self.node_id, m)))}

    async def _reserve(self, relays: dict[str, str]) -> Reservation | None:
        """A slot on the first of ``relays`` (id → address) that gives one, now this node's address; None if none
        did (each that refused is not asked again for :data:`SHUNNED_S`, unless no other can be)."""
        for relay_id, address in relays.items():
            try:
                held = await self.network.reserve(address, ReserveRequest(sender=self.node_id, swarm=self.swarm),
                                                  RESERVE_S)
            except (TransferRefused, PeerUnreachable) as exc:
                log.info("%s: %s gives no relay slot: %s", self.node_id, relay_id, exc)
                self._shunned[relay_id] = self.clock.monotonic() + SHUNNED_S
                continue
            relay_id = held.relay_id or relay_id
            log.info("%s: peers cannot dial it; relayed by %s, at %s", self.node_id, relay_id, held.address)
            self._set("relayed", held.address, relay_id)
            self.settled.set()
            self._held = held
            return held
        return None

    async def _hold(self, held: Reservation, until: float | None) -> bool:
        """Hold the slot until ``until`` (the node's clock; None: for as long as it lasts); whether it was lost
        meanwhile (the relay died, the link to it broke), and closed."""
        lost = asyncio.ensure_future(held.lost())
        try:
            done, _ = await asyncio.wait([lost], timeout=None if until is None else until - self.clock.monotonic())
        finally:
            lost.cancel()
        if lost not in done:
            return False
        log.warning("%s: its relay %s is lost (%s); finding another", self.node_id, self.relay, lost.result())
        self._shunned[self.relay] = self.clock.monotonic() + SHUNNED_S
        self.state = "unreachable"  # its address stays the lost slot until it holds another: one move, gossiped once
        await self._close(held)
        return True

    async def _close(self, held: Reservation) -> None:
        self._held = None
        await held.close()

    # ----- for others: dial-backs and slots ---------------------------------------------------
    async def dial_back(self, request: DialBackRequest,
                        dial: Callable[[str, float], Awaitable[HelloReply | None]]) -> Ack:
        """Dial a member back at the address it says it serves (``dial``: one Hello, answered by the member itself):
        whether peers can reach it. At most :data:`DIAL_BACKS` at once, each within :data:`DIAL_BACK_MAX_S`: a node
        is no tool to dial anywhere, and a fleet starting at once is answered "busy" rather than kept waiting."""
        if self._dialing >= DIAL_BACKS:
            return Ack(ok=False, reason="busy")
        self._dialing += 1
        deadline = self.clock.monotonic() + min(max(request.timeout_s, 0.1), DIAL_BACK_MAX_S)
        try:
            # tried again until the deadline: our channel there may still back off from the caller's last life
            while (reply := await dial(request.address, deadline - self.clock.monotonic())) is None:
                if self.clock.monotonic() + DIAL_BACK_RETRY_S >= deadline:
                    return Ack(ok=False, reason="unreachable")
                await asyncio.sleep(DIAL_BACK_RETRY_S)
        finally:
            self._dialing -= 1
        return Ack(ok=True) if reply.node_id == request.sender else Ack(ok=False, reason="unreachable")

    def may_relay(self, swarm: str) -> Ack:
        """Whether a node of ``swarm`` may hold a slot here (who it is, the network proved: mutual TLS, the swarm
        key): a member dialed us back (we are direct), and we relay (the slots left are the network's count)."""
        if swarm != self.swarm:
            return Ack(ok=False, reason="swarm_mismatch")
        if self.slots <= 0 or self.state != "direct":  # a slot here must be dialable
            return Ack(ok=False, reason="no_slot")
        return Ack(ok=True)


def _rank(node_id: str, relay: str) -> bytes:
    """Rendezvous hashing: each node ranks the relays its own way, so that relayed nodes spread over them."""
    return hashlib.sha256(f"{node_id}\x1f{relay}".encode()).digest()
