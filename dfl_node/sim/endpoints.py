"""One node's side of the simulator's fabric (:class:`MemoryNetwork`) and its link to each peer (:class:`MemoryLink`).

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
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.peering.control import kind_of
from dfl_node.peering.errors import (
    UNCOUNTED_REFUSALS,
    PeerUnreachable,
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
from dfl_node.peering.wire_dtypes import EXACT, payload_bytes
from dfl_node.sim.medium import Medium
from dfl_node.sim.payloads import copied, payload_key, whole_chunks, wire_size
from dfl_node.sim.relays import MemoryReservation
from dfl_node.sim.traffic import Traffic

T = TypeVar("T")


class MemoryNetwork:
    """One node's side of the fabric: the :class:`~dfl_node.peering.port.PeerNetwork` it is given. Its peers
    prove nothing: who answers at an address is who it says it is."""

    authentication = "none"

    def __init__(self, fabric: Medium, address: str, connect_timeout: float, wire_dtype: str = EXACT) -> None:
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
        fabric, which routes every call to the slot through the relay (:meth:`~dfl_node.sim.medium.Medium.cost`)."""
        ack = await self.link(relay).ask_slot(request, timeout)
        slot = self.fabric.reserve(relay, self.address) if ack.ok else None
        if slot is None:
            raise TransferRefused(ack.reason or "no_slot", f"{relay} refused a relay slot")
        return MemoryReservation(self.fabric, relay, slot, self.fabric.ids.get(relay, ""))

    def relay_load(self) -> RelayLoad:
        return self.fabric.loads[self.address]

    async def close(self) -> None:
        self.links.clear()



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
            arrived.bytes += whole_chunks(left, chunk, nbytes)
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
                pending = await intake.deliver(copied(message, self.wire_dtype))
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
        return copied(reply, self.wire_dtype), resume.sent, resume.received

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
            return copied(message, self.wire_dtype), resume.received

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
