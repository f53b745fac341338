"""The peer network port in memory: K real nodes in one process, each a :class:`PeerHandler` at an address.

:class:`MemoryFabric` is the medium every node shares: which address serves which node's handler, which
addresses are down (a killed node) or cut off from each other (a partition), and what each link costs
(:class:`~dfl_node.sim.link_profiles.LinkProfile`). A node gets its own :class:`MemoryNetwork` from it (its side of
every link), and passes it to :class:`~dfl_node.node.node.Node` in place of the gRPC network.

A call on a :class:`MemoryLink` drives the callee's handler exactly as :class:`~dfl_node.net.servicer.DflServicer`
does — same order, same counting, same errors — so node code cannot tell the two networks apart:

* each call runs as a task of its own, as an RPC does on a server: a deadline or a caller that gives up
  cancels it, and a kill of the callee cancels it (the caller then sees ``PeerUnreachable("unavailable")``);
* a push: ``admit`` (its refusal counted, raised as :class:`TransferRefused`), the payload's transfer time,
  ``deliver`` (abandoned if anything fails before it returned), then ``on_accepted`` once the verdict is back,
  then the reply future (a failure is the servicer's ``ABORTED``: :class:`PeerUnreachable`); epoch checks
  happen in the handler, as they do over gRPC;
* a link that drops (its profile's ``mtbf_s``) cuts each push's or pull's connection after a time drawn from the
  run's seed, and a callee killed mid-stream cuts it too: the caller sees :class:`TransferCut`, the receiving end
  keeps the whole chunks that arrived (``intake.interrupt``, or the :class:`Resume`), and the next attempt with
  the same :class:`Resume` carries only the rest, after a new connection's handshake — as over gRPC, with byte
  counts for bytes (a payload is known by a hash of its values, :func:`payload_key`, where a link can drop);
* models cross without serialization, but copied (a receiver over gRPC gets tensors of its own; a shared one
  would change under it when the sender trains on), as the codec decodes them on a lossy ``--wire-dtype``
  (:func:`~dfl_node.peering.wire_dtypes.through`), and counted as the wire would count them:
  :func:`wire_size`, payload plus a header estimate;
* reaching a peer fails as gRPC fails: a Hello to a dead address at once (connection refused), one across a
  partition at its deadline; the round RPCs wait for the peer to become reachable up to their deadline
  (gRPC's ``wait_for_ready``), and a push or pull refuses after ``connect_timeout`` (``PeerClient._reachable``).

Every delay is an ``asyncio.sleep`` on the loop's clock: free in wall time on a
:class:`~dfl_node.sim.clock.VirtualTimeLoop`.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from dataclasses import replace
from typing import Any, TypeVar

import torch

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.peering.control import kind_of
from dfl_node.peering.errors import (
    UNCOUNTED_REFUSALS,
    PeerUnreachable,
    TransferCut,
    TransferRefused,
    TransferRejected,
)
from dfl_node.peering.messages import (
    Ack,
    Assignment,
    DialBackRequest,
    Hello,
    HelloReply,
    Offer,
    Ping,
    PingAck,
    PullRequest,
    ReserveRequest,
    Token,
)
from dfl_node.peering.port import PeerHandler
from dfl_node.peering.probes import ProbeReply, ProbeRequest
from dfl_node.peering.relays import RelayLoad
from dfl_node.peering.resume import CHUNK, Resume
from dfl_node.peering.wire_dtypes import EXACT, payload_bytes, through
from dfl_node.sim.link_profiles import LinkProfile, ProfileFn
from dfl_node.sim.traffic import Traffic

T = TypeVar("T")

# The address of the node whose work the current task is: set for a node's own tasks (:meth:`MemoryFabric.spawn`)
# and for each call it serves, and inherited by every task they start, so that a kill can find them all.
_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("dfl_sim_owner", default=None)

_UNCAPPED = (math.inf, math.inf)
SLOT_PORTS = 40_000  # a relay slot is the relay's host and a port from here on: an address like any other
# What a transfer's header adds to its payload on the wire (sender, swarm, fingerprint, sha256…, and a manifest
# entry per tensor part): an estimate, so that the simulator's byte counts stay close to a daemon's.
HEADER_BYTES = 160
PART_HEADER_BYTES = 48


def current_node() -> str | None:
    """The address of the node whose task is running now (see :meth:`MemoryFabric.install`), if any."""
    return _OWNER.get()


def wire_size(message: ModelMessage, wire_dtype: str = EXACT) -> int:
    """The bytes ``message`` would take on a ``wire_dtype`` wire: its payload plus an estimate of its header."""
    return payload_bytes(message, wire_dtype) + HEADER_BYTES + PART_HEADER_BYTES * len(message.parts)


def payload_key(message: ModelMessage) -> bytes:
    """What identifies a message's payload, as its digest does over gRPC: a hash of its parts' values (computed only
    where a link may cut a transfer, which a resumed one must name)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in message.parts:
        digest.update(part.name.encode())
        digest.update(part.values.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
    return digest.digest()


def _whole_chunks(nbytes: int, chunk: int, most: int) -> int:
    """The bytes of whole chunks among ``nbytes`` that crossed (a gRPC message arrives whole or not at all)."""
    return min(most, nbytes // chunk * chunk)


def _copied(message: ModelMessage, wire_dtype: str = EXACT) -> ModelMessage:
    """``message`` with tensors of its own, as a receiver over gRPC has them (no serialization, one copy), and
    decoded as the codec decodes a lossy ``wire_dtype``."""
    crossed = through(message, wire_dtype)
    return replace(crossed, parts=tuple(replace(p, values=p.values.detach().clone()) for p in crossed.parts),
                   metadata=dict(message.metadata))


class MemoryFabric:
    """The medium shared by all nodes of a simulation (see the module's docstring)."""

    def __init__(self, profile: ProfileFn | None = None, seed: int = 0) -> None:
        self.handlers: dict[str, PeerHandler] = {}
        self.ids: dict[str, str] = {}  # address -> the id of the node serving there (a relay says its id)
        self.cuts = random.Random(f"{seed}-cuts")  # how long each connection over a link that drops lasts
        self.caps: dict[str, tuple[float, float]] = {}  # address -> its node's (upload, download) caps, bytes/s
        self.nat: set[str] = set()  # addresses behind NAT: nobody dials them; their nodes are reached by relays
        self.slots: dict[str, tuple[str, str]] = {}  # a relay slot's address -> (its relay's, its node's)
        self.relay_slots: dict[str, int] = {}  # address -> the slots its node gives at most (--relay-slots)
        self.loads: dict[str, RelayLoad] = defaultdict(RelayLoad)  # address -> what it carried as a relay
        self._slot_ports = 0
        self.down: set[str] = set()
        self.groups: dict[str, int] = {}  # a partition: address -> its side (addresses not listed reach everyone)
        self.profile: ProfileFn = profile or (lambda src, dst: LinkProfile())
        self.served: dict[str, set[asyncio.Task[Any]]] = defaultdict(set)  # calls in progress, by callee
        self.owned: dict[str, set[asyncio.Task[Any]]] = defaultdict(set)  # every live task of a node, by address
        # who waits for reachability at an address to change: each waiter's event under every address it depends
        # on, so a change wakes only those it concerns (a thousand nodes each waiting on its slot, a thousand slots
        # reserved at a start: not a million wake-ups)
        self._watchers: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._held: dict[str, str] = {}  # a node's address -> the slot it holds
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----- whose work a task is -----------------------------------------------------------
    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Track on ``loop`` which node each task works for (its task factory): a task started by a node's task,
        or by a call it serves, is that node's, so :meth:`kill` cancels whatever the node was doing — its
        scheduler, its hold of the token, a role it plays, an announcement it sends — as kill -9 would."""
        self._loop = loop
        loop.set_task_factory(self._task_factory)

    def _task_factory(self, loop: asyncio.AbstractEventLoop,
                      coro: Coroutine[Any, Any, T] | Generator[Any, None, T], /, *,
                      context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = _OWNER.get(None) if context is None else context.get(_OWNER)  # None: the task runs in a copy of ours
        if owner is not None:
            owned = self.owned[owner]
            owned.add(task)
            task.add_done_callback(owned.discard)
        return task

    def _as(self, address: str) -> contextvars.Context:
        context = contextvars.copy_context()
        context.run(_OWNER.set, address)
        return context

    def spawn(self, address: str, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``work`` as a task of the node at ``address`` (one that :meth:`kill` cancels)."""
        if self._loop is None:
            self.install(asyncio.get_running_loop())
        return asyncio.get_running_loop().create_task(work, context=self._as(address))

    # ----- the fleet ----------------------------------------------------------------------
    def endpoint(self, address: str, *, connect_timeout: float = 5.0, wire_dtype: str = EXACT,
                 max_upload: float = 0.0, max_download: float = 0.0, relay_slots: int = 0,
                 behind_nat: bool = False) -> MemoryNetwork:
        """The network of the node that will serve at ``address`` (:meth:`serve` it once it is built); its models
        and those sent to it cross as a ``wire_dtype`` wire delivers them (the same on every node: Hello), no
        faster than its caps (bytes/s; 0: none); it relays up to ``relay_slots`` nodes; ``behind_nat``: nobody
        can dial it."""
        if max_upload or max_download:
            self.caps[address] = (max_upload or math.inf, max_download or math.inf)
        self.relay_slots[address] = relay_slots
        if behind_nat:
            self.nat.add(address)
        return MemoryNetwork(self, address, connect_timeout, wire_dtype)

    def cost(self, src: str, dst: str) -> LinkProfile:
        """What the link from ``src`` to ``dst`` costs now: its profile, its bandwidth held to the sender's upload
        cap and the receiver's download cap; through a slot, both hops (their latencies added, the slower's
        bandwidth, the shorter-lived's connections)."""
        if dst in self.slots:
            relay, node = self.slots[dst]
            a, b = self.cost(src, relay), self.cost(relay, node)
            return LinkProfile(a.latency_s + b.latency_s, min(a.bandwidth, b.bandwidth), min(a.mtbf_s, b.mtbf_s))
        if src in self.slots:  # an answer back through a slot: the way it came
            relay, node = self.slots[src]
            a, b = self.cost(node, relay), self.cost(relay, dst)
            return LinkProfile(a.latency_s + b.latency_s, min(a.bandwidth, b.bandwidth), min(a.mtbf_s, b.mtbf_s))
        link = self.profile(src, dst)
        if not self.caps:  # every membership message asks: no lookups where no node has a cap
            return link
        capped = min(link.bandwidth, self.caps.get(src, _UNCAPPED)[0], self.caps.get(dst, _UNCAPPED)[1])
        return link if capped == link.bandwidth else replace(link, bandwidth=capped)

    def serve(self, address: str, handler: PeerHandler, node_id: str = "") -> None:
        """``handler`` (node ``node_id``'s) answers at ``address`` from now on (a node started, or restarted)."""
        self.handlers[address] = handler
        self.ids[address] = node_id
        self.down.discard(address)
        self._notify(address)

    def kill(self, address: str) -> list[asyncio.Task[Any]]:
        """kill -9 of the node at ``address``: nothing answers there any more, the calls it was serving are
        cancelled (its callers see the connection drop), and so is every task of its own (:meth:`install`).
        Returns those tasks, for whoever must wait until they have ended."""
        self.down.add(address)
        self.handlers.pop(address, None)
        tasks = [*self.served.pop(address, ()), *self.owned.pop(address, ())]
        for task in tasks:
            task.cancel()
        self._notify(address)
        return tasks

    def partition(self, *sides: set[str]) -> None:
        """Cut the links between ``sides`` (each a set of addresses) until :meth:`heal`."""
        self.groups = {address: i for i, side in enumerate(sides) for address in side}
        self._notify()

    def heal(self) -> None:
        self.groups = {}
        self._notify()

    def _notify(self, *addresses: str) -> None:
        """Reachability changed at ``addresses`` (none given: anywhere, as a partition changes it)."""
        for address in addresses or list(self._watchers):
            for event in self._watchers.pop(address, ()):
                event.set()

    async def _until_changed(self, addresses: Iterable[str]) -> None:
        """Until reachability changes at one of ``addresses``."""
        event, watched = asyncio.Event(), set(addresses)
        for address in watched:
            self._watchers[address].add(event)
        try:
            await event.wait()
        finally:
            for address in watched:
                waiting = self._watchers.get(address)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._watchers[address]

    def _depends(self, address: str) -> tuple[str, ...]:
        """The addresses whose changes change whether ``address`` answers: itself, and a slot's relay and node."""
        return (address, *self.slots.get(address, ()))

    # ----- reachability -------------------------------------------------------------------
    def listening(self, address: str) -> bool:
        """Whether anything answers a connection to ``address``: its node (through its relay, for a slot)."""
        if address in self.slots:
            relay, node = self.slots[address]
            return self.listening(relay) and self.listening(node) and not self.cut(node, relay)
        return address in self.handlers and address not in self.down

    def cut(self, src: str, dst: str) -> bool:
        """Whether a connection from ``src`` to ``dst`` cannot be made: a partition between them (or between a slot's
        relay and its node), or ``dst`` behind NAT."""
        if dst in self.slots:
            relay, node = self.slots[dst]
            return self.cut(src, relay) or self.cut(node, relay)
        if dst in self.nat and src != dst:
            return True
        a, b = self.groups.get(src), self.groups.get(dst)
        return a is not None and b is not None and a != b

    def reachable(self, src: str, dst: str) -> bool:
        return self.listening(dst) and not self.cut(src, dst)

    # ----- relays -------------------------------------------------------------------------
    def reserve(self, relay: str, node: str) -> str | None:
        """A slot on ``relay`` for ``node`` (one it held before replaced): its address, or None where ``relay`` has
        none left (its node's ``--relay-slots``)."""
        if (held := self._held.get(node)) is not None:
            self.release(held)
        if self.loads[relay].slots >= self.relay_slots.get(relay, 0):
            self.loads[relay].refused += 1
            return None
        self._slot_ports += 1
        slot = f"{relay.rpartition(':')[0]}:{SLOT_PORTS + self._slot_ports}"
        self.slots[slot], self._held[node] = (relay, node), slot
        self.loads[relay].slots += 1
        self._notify(slot)
        return slot

    def release(self, slot: str) -> None:
        relay, node = self.slots.pop(slot, (None, None))
        if relay is not None and node is not None:
            self.loads[relay].slots -= 1
            del self._held[node]
            self._notify(slot)

    def relayed(self, slot: str, nbytes: int) -> None:
        """A message of ``nbytes`` through ``slot``: counted by its relay."""
        relay, _ = self.slots[slot]
        self.loads[relay].connections += 1
        self.loads[relay].bytes += nbytes

    async def until_lost(self, slot: str) -> str:
        """Until ``slot`` stops carrying: its relay or its node died, or a partition cut them apart; why."""
        while True:
            if slot not in self.slots:
                return "released"
            relay, node = self.slots[slot]
            if not self.listening(relay):
                return "the relay stopped"
            if self.cut(node, relay):
                return "cut off from the relay"
            await self._until_changed((slot, relay, node))

    async def until_reachable(self, src: str, dst: str, timeout: float) -> bool:
        """Whether ``dst`` became reachable from ``src`` within ``timeout`` (at once if it is)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.reachable(src, dst):
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._until_changed((*self._depends(dst), src)), left)
            except TimeoutError:
                return False
        return True

    async def call(self, dst: str, work: Coroutine[Any, Any, T], timeout: float, *, lifetime: float = math.inf,
                   stream: bool = False) -> T:
        """Run ``work`` as a call served by ``dst`` (a task of its own), for at most ``timeout`` seconds, over a
        connection the link cuts after ``lifetime``; a ``stream`` (a push, a pull) whose callee dies is cut too."""
        relay, callee = self.slots.get(dst, (None, dst))  # through a slot: its node serves it, over its relay
        task = asyncio.get_running_loop().create_task(work, context=self._as(callee))  # the callee's work
        for carrier in (callee, relay) if relay is not None else (callee,):  # either one's death drops it
            served = self.served[carrier]
            served.add(task)
            task.add_done_callback(served.discard)
        try:
            async with asyncio.timeout(min(timeout, lifetime)):  # cancels the call's task then, as wait_for would
                return await task
        except TimeoutError:
            if lifetime < timeout:
                raise TransferCut(f"the link dropped the connection after {lifetime:.3g} s") from None
            raise PeerUnreachable("deadline_exceeded", f"does not answer within {timeout:g} s") from None
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                raise  # our own task is cancelled (the call was cancelled with it)
            if stream:
                raise TransferCut("the connection closed (the peer stopped)") from None
            raise PeerUnreachable("unavailable", "closed the connection (it stopped)") from None


class MemoryNetwork:
    """One node's side of the fabric: the :class:`~dfl_node.peering.port.PeerNetwork` it is given. Its peers
    prove nothing: who answers at an address is who it says it is."""

    authentication = "none"

    def __init__(self, fabric: MemoryFabric, address: str, connect_timeout: float, wire_dtype: str = EXACT) -> None:
        self.fabric, self.address, self.connect_timeout, self.wire_dtype = fabric, address, connect_timeout, wire_dtype
        self.links: dict[str, MemoryLink] = {}
        self.membership = Traffic()  # the Hellos, pings and their answers of the calls this node made
        self.control = Traffic()  # the control messages and their replies of the calls this node made

    def link(self, address: str) -> MemoryLink:
        if address not in self.links:
            self.links[address] = MemoryLink(self, address)
        return self.links[address]

    def forget(self, address: str) -> None:
        self.links.pop(address, None)

    def heard(self, address: str, node_id: str) -> None:
        """No identities to check here."""

    async def confirm(self, address: str, reply: HelloReply, hello: Callable[[], Hello], timeout: float) -> bool:
        return True

    async def reserve(self, relay: str, request: ReserveRequest, timeout: float) -> MemoryReservation:
        """A slot on ``relay``: asked of its node (a member of our swarm, reached directly), then held on the
        fabric, which routes every call to the slot through the relay (:meth:`MemoryFabric.cost`)."""
        ack = await self.link(relay).ask_slot(request, timeout)
        slot = self.fabric.reserve(relay, self.address) if ack.ok else None
        if slot is None:
            raise TransferRefused(ack.reason or "no_slot", f"{relay} refused a relay slot")
        return MemoryReservation(self.fabric, relay, slot, self.fabric.ids.get(relay, ""))

    def relay_load(self) -> RelayLoad:
        return self.fabric.loads[self.address]

    async def close(self) -> None:
        self.links.clear()


class MemoryReservation:
    """A relay slot on the fabric (:class:`~dfl_node.peering.relays.Reservation`): lost when the relay stops or a
    partition cuts its node from it."""

    def __init__(self, fabric: MemoryFabric, relay: str, address: str, relay_id: str) -> None:
        self.fabric, self.relay, self.address, self.relay_id = fabric, relay, address, relay_id

    async def lost(self) -> str:
        return await self.fabric.until_lost(self.address)

    async def close(self) -> None:
        self.fabric.release(self.address)


class MemoryLink:
    """One node's link to one peer (a :class:`~dfl_node.peering.port.PeerLink`)."""

    def __init__(self, network: MemoryNetwork, address: str) -> None:
        self.network = network
        self.fabric, self.src, self.dst = network.fabric, network.address, address
        self.connect_timeout = network.connect_timeout
        self.wire_dtype = network.wire_dtype

    def _handler(self) -> PeerHandler:
        node = self.fabric.slots[self.dst][1] if self.dst in self.fabric.slots else self.dst
        handler = self.fabric.handlers.get(node)
        if handler is None:  # it died between our check and now
            raise PeerUnreachable("unavailable", "refuses connections (nothing listens on that port)")
        return handler

    async def _travel(self, nbytes: int = 0, back: bool = False) -> None:
        """One message over the link (``back``: from the peer to us), as its profile says (through a slot: counted
        by its relay)."""
        if self.dst in self.fabric.slots:
            self.fabric.relayed(self.dst, nbytes)
        src, dst = (self.dst, self.src) if back else (self.src, self.dst)
        delay = self.fabric.cost(src, dst).delay(nbytes)
        if delay > 0:
            await asyncio.sleep(delay)

    async def _ready(self, timeout: float) -> None:
        """gRPC's ``wait_for_ready``: until the peer is reachable, else the call's deadline passes."""
        if not await self.fabric.until_reachable(self.src, self.dst, timeout):
            raise PeerUnreachable("deadline_exceeded", f"does not answer within {timeout:g} s")

    async def _connect(self) -> None:
        """A push's or pull's connection (``PeerClient._reachable``): refused after ``connect_timeout``."""
        if not await self.fabric.until_reachable(self.src, self.dst, self.connect_timeout):
            raise TransferRefused("unreachable", f"{self.dst} did not accept a connection within "
                                                 f"{self.connect_timeout:g} s")

    async def _unary(self, answer: Callable[[PeerHandler], Awaitable[T]], timeout: float) -> T:
        """A round RPC (``wait_for_ready``): until the peer is reachable, then its answer, within ``timeout``."""
        await self._ready(timeout)
        return await self._exchange(answer, timeout)

    async def _exchange(self, answer: Callable[[PeerHandler], Awaitable[T]], timeout: float) -> T:
        handler = self._handler()

        async def served() -> T:
            await self._travel()
            reply = await answer(handler)
            await self._travel(back=True)
            return reply

        return await self.fabric.call(self.dst, served(), timeout)

    async def _membership(self, request: object, answer: Callable[[PeerHandler], Awaitable[T]], timeout: float) -> T:
        """A Hello or a membership ping, counted both ways (:class:`Traffic`): no ``wait_for_ready``,
        so refused at once by a dead address, and lost (its deadline passes) across a partition."""
        self.network.membership.count(request)
        if not self.fabric.listening(self.dst):
            raise PeerUnreachable("unavailable", "refuses connections (nothing listens on that port)")
        if self.fabric.cut(self.src, self.dst):
            await asyncio.sleep(timeout)
            raise PeerUnreachable("deadline_exceeded", f"does not answer within {timeout:g} s")
        reply = await self._exchange(answer, timeout)
        self.network.membership.count(reply)
        return reply

    # ----- the calls --------------------------------------------------------------------------------
    async def hello(self, hello: Hello, timeout: float) -> HelloReply:
        async def answer(h: PeerHandler) -> HelloReply:
            return h.hello(hello, self.src)
        return await self._membership(hello, answer, timeout)

    async def ping(self, ping: Ping, timeout: float) -> PingAck:
        async def answer(h: PeerHandler) -> PingAck:
            return await h.ping(ping)
        return await self._membership(ping, answer, timeout)

    async def dial_back(self, request: DialBackRequest, timeout: float) -> Ack:
        async def answer(h: PeerHandler) -> Ack:
            return await h.dial_back(request)
        return await self._unary(answer, timeout)

    async def ask_slot(self, request: ReserveRequest, timeout: float) -> Ack:
        """A relay's node asked for a slot (the fabric then holds it: :meth:`MemoryNetwork.reserve`)."""
        async def answer(h: PeerHandler) -> Ack:
            return await h.reserve(request)
        return await self._unary(answer, timeout)

    async def assign(self, assignment: Assignment, timeout: float) -> Ack:
        async def answer(h: PeerHandler) -> Ack:
            return _counted(h, await h.assign(assignment), assignment.holder,
                            f"{assignment.role!r} of round {assignment.round}, epoch {assignment.epoch}")
        return await self._unary(answer, timeout)

    async def pass_token(self, token: Token, timeout: float) -> Ack:
        async def answer(h: PeerHandler) -> Ack:
            return _counted(h, await h.token(token), token.holder, f"token of round {token.round}, epoch {token.epoch}")
        return await self._unary(answer, timeout)

    async def probe(self, request: ProbeRequest, timeout: float) -> ProbeReply:
        async def answer(h: PeerHandler) -> ProbeReply:
            reply = await h.probe(request)
            if not reply.ok and reply.reason not in UNCOUNTED_REFUSALS:
                h.on_rejected(reply.reason, f"probe of round {request.round}", request.sender[:64] or self.src)
            return reply
        return await self._unary(answer, timeout)

    async def call(self, message: object, timeout: float) -> Any:
        """A control message: a round RPC, handed over as it is (of a registered kind, as gRPC would encode it), the
        callee's refusal counted as the servicer counts it; counted both ways (:class:`Traffic`)."""
        kind_of(message)
        self.network.control.count(message)

        async def answer(h: PeerHandler) -> object:
            try:
                return await h.control(message)
            except TransferRejected as exc:
                if exc.reason not in UNCOUNTED_REFUSALS:
                    h.on_rejected(exc.reason, exc.detail, self.src)
                raise TransferRefused(exc.reason, exc.detail) from exc
        reply = await self._unary(answer, timeout)
        self.network.control.count(reply)
        return reply

    async def push(self, message: ModelMessage, epoch: int, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None,
                   resume: Resume | None = None) -> tuple[ModelMessage | None, int, int]:
        resume = resume if resume is not None else Resume()
        lifetime = await self._open(resume)
        if resume.prepared is None:
            resume.prepared = payload_key(message) if self._may_cut() else b""
        resume.size = wire_size(message, self.wire_dtype)
        work = self._transfer(self._handler(), message, epoch, on_accepted, resume)
        return await self.fabric.call(self.dst, work, timeout, lifetime=lifetime, stream=True)

    def _may_cut(self) -> bool:
        return math.isfinite(self.fabric.cost(self.src, self.dst).mtbf_s)

    async def _open(self, resume: Resume) -> float:
        """A push's or pull's connection: reachable within ``connect_timeout`` (:meth:`_connect`), its handshake
        when it follows a cut one (the first rides on a connection kept open), and how long it will last."""
        await self._connect()
        resume.attempts += 1
        if resume.resuming:
            await self._travel()
            await self._travel(back=True)
        return self.fabric.cost(self.src, self.dst).lifetime(self.fabric.cuts)

    async def _carry(self, nbytes: int, chunk: int, arrived: _Arrived, back: bool = False) -> None:
        """``nbytes`` over the link, counted into ``arrived``: all of them, or, if the connection is cut meanwhile
        (the call cancelled), what left before and, of that, the whole chunks of ``chunk`` bytes that arrived (the
        cancellation goes on)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await self._travel(nbytes, back=back)
        except asyncio.CancelledError:
            src, dst = (self.dst, self.src) if back else (self.src, self.dst)
            left = min(nbytes, self.fabric.cost(src, dst).carried(loop.time() - began))
            arrived.sent += left
            arrived.bytes += _whole_chunks(left, chunk, nbytes)
            raise
        arrived.sent += nbytes
        arrived.bytes += nbytes

    async def _transfer(self, handler: PeerHandler, message: ModelMessage, epoch: int,
                        on_accepted: Callable[[], None] | None, resume: Resume) -> tuple[ModelMessage | None, int, int]:
        """The server's side of a push, in :meth:`DflServicer.Transfer`'s order (see the module's docstring)."""
        payload = payload_bytes(message, self.wire_dtype)
        header = wire_size(message, self.wire_dtype) - payload
        offer = Offer(sender=message.sender, round=message.round, epoch=epoch, purpose=message.purpose,
                      model=message.model, total_size=payload, digest=resume.prepared, resume=resume.resuming)
        chunk = resume.chunk_bytes or CHUNK
        await self._travel()  # the header
        intake, pending, start, arrived = None, None, 0, _Arrived()
        try:
            intake = await handler.admit(offer)
            if resume.resuming:
                pending = intake.arrived
                start = payload if pending is not None else intake.held if isinstance(intake.held, int) else 0
                arrived.bytes = resume.offset = start
                await self._travel(back=True)  # ResumeAt
            if pending is None:
                await self._carry(payload - start, chunk, arrived)
                pending = await intake.deliver(_copied(message, self.wire_dtype))
            intake = None  # delivered: from here the aggregator owns it, even if this call is cancelled
        except TransferRejected as exc:
            handler.on_rejected(exc.reason, exc.detail, message.sender)
            raise TransferRefused(exc.reason, exc.detail) from exc
        except asyncio.CancelledError:
            if intake is not None:  # cut (or its sender died) before the payload was whole: as the servicer does
                intake.interrupt(arrived.bytes, f"{arrived.bytes} of {payload} bytes received")
                intake = None
            raise
        finally:
            if intake is not None:
                intake.abandon()
            handler.on_transferred(0, header + arrived.bytes - start)  # what this stream brought
            resume.sent += header + arrived.sent  # what it carried (a chunk cut halfway left, and is lost)
        await self._travel(back=True)  # the verdict
        resume.offset = payload
        if on_accepted is not None:
            on_accepted()
        try:
            reply = await asyncio.shield(pending) if pending is not None else None  # a cut leaves it to a resumption
        except TransferRejected as exc:  # the servicer's ABORTED status, which a PeerClient reports as unreachable
            raise PeerUnreachable("aborted", f"{exc.reason}: {exc.detail}") from exc
        if reply is None:
            return None, resume.sent, resume.received
        await self._send_back(handler, reply, resume)
        return _copied(reply, self.wire_dtype), resume.sent, resume.received

    async def _send_back(self, handler: PeerHandler, message: ModelMessage, resume: Resume) -> None:
        """A reply or a pulled model, from ``handler``'s node back to us: from what ``resume`` holds of this very
        payload (a stream that was cut) on; a cut keeps what arrived for the next attempt."""
        key = payload_key(message) if self._may_cut() else b""
        size = wire_size(message, self.wire_dtype)
        held = resume.held if isinstance(resume.held, tuple) and resume.held[0] == key else None
        start = held[1] if held is not None else 0
        carried = _Arrived()
        try:
            await self._carry(size - start, resume.chunk_bytes or CHUNK, carried, back=True)
        except asyncio.CancelledError:
            resume.held = (key, start + carried.bytes)
            raise
        finally:
            handler.on_transferred(carried.sent, 0)
            resume.received += carried.bytes
        resume.held = None

    async def pull(self, request: PullRequest, *, timeout: float,
                   resume: Resume | None = None) -> tuple[ModelMessage, int]:
        resume = resume if resume is not None else Resume()
        lifetime = await self._open(resume)
        handler = self._handler()

        async def served() -> tuple[ModelMessage, int]:
            await self._travel()
            try:
                message = await handler.pull(request)
            except TransferRejected as exc:
                if exc.reason not in UNCOUNTED_REFUSALS:
                    handler.on_rejected(exc.reason, exc.detail, request.aggregator[:64] or self.src)
                raise TransferRefused(exc.reason, exc.detail) from exc
            await self._send_back(handler, message, resume)
            return _copied(message, self.wire_dtype), resume.received

        return await self.fabric.call(self.dst, served(), timeout, lifetime=lifetime, stream=True)

    async def close(self) -> None:
        pass


class _Arrived:
    """The bytes of a payload that left so far (``sent``), and of those the ones that arrived (``bytes``: whole
    chunks, where the connection was cut: a chunk cut halfway is lost)."""

    sent = 0
    bytes = 0


def _counted(handler: PeerHandler, ack: Ack, who: str, what: str) -> Ack:
    """An Ack that refuses is counted, as the servicer counts it (unless it is an outcome, not a refusal)."""
    if not ack.ok and ack.reason not in UNCOUNTED_REFUSALS:
        handler.on_rejected(ack.reason, what, who[:64] or "?")
    return ack
