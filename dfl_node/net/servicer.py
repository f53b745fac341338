"""The RPC side of a node: each call of the ``DflNode`` service turned into a call on its
:class:`~dfl_node.peering.port.PeerHandler`, in the port's own messages (converted here, :mod:`dfl_node.net.convert`).

The servicer does all the byte work itself: it validates a Transfer's stream with
:class:`~dfl_node.net.assembler.MessageAssembler` *before* the node sees a model, refuses and counts what a
connection may not send (:mod:`dfl_node.net.auth`), and streams replies back. How gRPC reaches it
(request decoding) is :mod:`dfl_node.net.handlers`; binding it to a port, :mod:`dfl_node.net.server`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Role
from dfl_node.hashes import DEFAULT_HASH, negotiate
from dfl_node.net.assembler import MessageAssembler, assemble
from dfl_node.net.auth import Authenticator
from dfl_node.net.convert import from_wire, to_wire, transfer_result
from dfl_node.net.encoder import copy_header
from dfl_node.net.envelopes import opened, refusal_status, reply_sealed
from dfl_node.net.frames import ReadFrame, WireFrame, wire_size
from dfl_node.net.manifest import chunk_for
from dfl_node.net.pacing import NO_PACING, Pacing
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.relay import RelayServer
from dfl_node.net.wire import WireIdentity
from dfl_node.peering.control import kind_of
from dfl_node.peering.errors import UNCOUNTED_REFUSALS, TransferRejected
from dfl_node.peering.messages import (
    MAX_MEMBERS,
    MAX_UPDATES,
    Assignment,
    DialBackRequest,
    Hello,
    Offer,
    Ping,
    PullRequest,
    ReserveRequest,
    Token,
)
from dfl_node.peering.port import Intake, PeerHandler
from dfl_node.peering.probes import ProbeRequest

log = logging.getLogger(__name__)
RELAY_HEARTBEAT_S = 5.0  # a relay's empty event on a reservation's stream: its node knows the slot is held


def _assignment_problem(request: pb.RoundAssignment) -> str | None:
    """Why an assignment names no role a node can take, or None. Checked before the node sees it: a round-mode
    scheduler adopts an assignment's epoch and holder before it plays the role, so a malformed one (an unknown
    role, from epoch 2**64 - 1) would otherwise fence the node off from its fleet although it is refused."""
    if request.role not in (Role.SENDER.value, Role.AGGREGATOR.value):
        return f"unknown role {request.role[:40]!r}"
    if request.candidates and request.role != Role.SENDER.value:
        return f"a {request.role} with candidates (only a sender chooses among candidates)"
    return None


class DflServicer(pb_grpc.DflNodeServicer):
    """The gRPC service of ``node``: received models are checked against ``wire``, a Transfer stream silent for
    ``idle_timeout`` is dropped (it never holds a role or a buffer)."""

    def __init__(self, node: PeerHandler, wire: WireIdentity, idle_timeout: float,
                 auth: Authenticator | None = None, pacing: Pacing = NO_PACING,
                 relay: RelayServer | None = None) -> None:
        self.node, self.wire, self.idle_timeout = node, wire, idle_timeout
        self.pacing = pacing  # the node's caps: the pushes it reads, the replies and pulled models it streams
        self.relay = relay  # its relay slots for members their peers cannot dial (None: it relays nobody)
        self.auth = auth or Authenticator()  # TLS (mTLS or a swarm key): who may call, as whom (dfl_node.net.auth)

    async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
        reply = to_wire(self.node.hello(from_wire(request, Hello), context.peer(), self.auth.hello(request, context)))
        reply.hashes[:] = self.wire.hashes  # what the peer's pushes may carry (hashes.negotiate)
        return reply

    def _refuse(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> TransferRejected | None:
        """A refusal (counted) of an RPC whose connection proved no node id, or that names another sender."""
        refusal = self.auth.refusal(context, claimed)
        if refusal is None:
            return None
        self.node.on_rejected(*refusal, claimed or context.peer())
        return TransferRejected(*refusal)

    def _refused(self, reason: str, detail: str, who: str) -> None:
        """Count a refusal that the node answered rather than raised (see ``UNCOUNTED_REFUSALS``)."""
        if reason not in UNCOUNTED_REFUSALS:
            self.node.on_rejected(reason, detail, who)

    async def _check_unary(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> None:
        refused = self._refuse(context, claimed)
        if refused is not None:
            code = (grpc.StatusCode.UNAUTHENTICATED if refused.reason == "unauthenticated"
                    else grpc.StatusCode.PERMISSION_DENIED)
            await context.abort(code, f"{refused.reason}: {refused.detail}")

    async def Transfer(
        self, request_iterator: AsyncIterator[ReadFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[WireFrame]:
        wire = self.wire
        assembler = wire.assembler()
        frames = _idle_limited(request_iterator, self.idle_timeout)
        intake: Intake | None = None
        pending_reply: asyncio.Future[ModelMessage | None] | None = None
        start = 0  # payload bytes this stream need not carry: its receiver holds them from a stream that was cut
        try:
            first = await anext(frames, None)
            if first is None:
                raise TransferRejected("truncated", "empty stream")
            claimed = first.header.sender if isinstance(first, pb.Frame) and first.HasField("header") else None
            if refused := self._refuse(context, claimed):
                raise refused  # unauthenticated, or in another's name: nothing more of it is parsed
            header = assembler.first_header(first)  # swarm, fingerprint, manifest, sizes: before the node is asked
            intake = await self.node.admit(from_wire(header, Offer))
            if header.resume:
                assembler, pending_reply = _resumed(assembler, header, intake)
                start = header.total_size if pending_reply is not None else assembler.received
                yield pb.Frame(resume=pb.ResumeAt(offset=start))
            else:
                assembler.begin(header)
            if pending_reply is None:
                header, message = await assemble(frames, assembler, self.pacing.received)
                pending_reply = await intake.deliver(message)
            else:
                await _ended(frames)  # it had arrived: nothing follows the header
            intake = None  # delivered: from here the aggregator owns the message, even if this RPC is cancelled
        except TransferRejected as exc:
            sender = assembler.header.sender if assembler.header is not None else "?"
            if intake is not None and exc.reason == "truncated" and assembler.header is not None:
                intake.interrupt(assembler, exc.detail)  # cut, it seems: kept for its sender to resume (or refused)
                intake = None
            elif exc.reason not in ("unauthenticated", "identity_mismatch"):  # those are counted by _refuse
                self.node.on_rejected(exc.reason, exc.detail, sender)
            yield pb.Frame(result=transfer_result(exc))
            return
        except asyncio.CancelledError:  # the connection dropped (gRPC cancels the call), before or after its end
            if intake is not None and assembler.header is not None:
                intake.interrupt(assembler, f"{assembler.received} of {assembler.header.total_size} bytes received")
                intake = None
            raise
        except Exception:  # a bug, not the peer's fault: say where (gRPC would only answer UNKNOWN), keep serving
            log.exception("Transfer from %s failed", assembler.header.sender if assembler.header else "?")
            raise
        finally:
            if assembler.header is not None:  # what this stream carried, cut or not
                self.node.on_transferred(0, assembler.received - start + assembler.header.ByteSize())
            if intake is not None:
                intake.abandon()
        yield pb.Frame(result=pb.TransferResult(accepted=True))  # validated and taken for aggregation
        try:  # resolves once the fusion is durable: the end of this stream is the sender's confirmation (shielded:
            # a stream cut meanwhile must leave it to the stream that resumes)
            reply = await asyncio.shield(pending_reply) if pending_reply is not None else None
        except TransferRejected as exc:  # the group ended without fusing it: an error status, never a clean end
            await context.abort(grpc.StatusCode.ABORTED, f"{exc.reason}: {exc.detail}")
        if reply is not None:
            hash_ = header.hash or DEFAULT_HASH  # the sender's own: it takes it
            async for frame in self._stream(reply, hash_, header.reply_digest, header.reply_offset, header.chunk_size):
                yield frame

    async def _stream(self, message: ModelMessage, hash: str, held_digest: bytes = b"", held: int = 0,
                      chunk_size: int = 0) -> AsyncIterator[WireFrame]:
        """``message`` as frames: from byte ``held`` on where its receiver holds that much of this very payload
        (``held_digest``, from a stream that was cut), else whole; in chunks of at most ``chunk_size`` bytes."""
        outgoing = await asyncio.to_thread(self.wire.prepare, message, 0, hash)
        header = outgoing.header
        start = held if held_digest == header.digest and 0 < held <= header.total_size else 0
        if start:
            header = copy_header(header, start=start)
        sent = wire_size(frame := pb.Frame(header=header))
        yield frame
        for chunk in outgoing.chunks(start, self.pacing.chunk(chunk_for(chunk_size))):
            await self.pacing.sent(len(chunk))
            sent += len(chunk)
            yield chunk
        self.node.on_transferred(sent, 0)

    async def Pull(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[WireFrame]:
        if refused := self._refuse(context, request.aggregator):
            yield pb.Frame(result=transfer_result(refused))
            return
        try:
            message = await self.node.pull(from_wire(request, PullRequest))
        except TransferRejected as exc:
            self._refused(exc.reason, exc.detail, request.aggregator[:64] or context.peer())
            yield pb.Frame(result=transfer_result(exc))
            return
        async for frame in self._stream(message, negotiate(self.wire.hashes, request.hashes), request.digest,
                                        request.offset, request.chunk_size):
            yield frame

    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeReply:
        await self._check_unary(context, request.sender)
        reply = await self.node.probe(from_wire(request, ProbeRequest))
        if not reply.ok:
            self._refused(reply.reason, f"probe of round {request.round}", request.sender[:64] or context.peer())
        return to_wire(reply)

    async def Ping(self, request: pb.MembershipPing, context: grpc.aio.ServicerContext) -> pb.MembershipAck:
        """A membership probe: from an authenticated member (mTLS: the sender its certificate names), its size
        bounded (``MAX_UPDATES``, or ``MAX_MEMBERS`` in a push-pull) before anything of it is converted."""
        await self._check_unary(context, request.sender)
        limit = MAX_MEMBERS if request.sync else MAX_UPDATES
        if len(request.updates) > limit:
            self.node.on_rejected("too_many_updates", f"a membership ping with {len(request.updates)} updates "
                                  f"(at most {limit})", request.sender[:64] or context.peer())
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "too_many_updates")
        return to_wire(await self.node.ping(from_wire(request, Ping)))

    async def DialBack(self, request: pb.DialBackRequest, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._check_unary(context, request.sender)
        return to_wire(await self.node.dial_back(from_wire(request, DialBackRequest)))

    async def Reserve(self, request: pb.ReserveRequest,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RelayEvent]:
        """A relay slot for an authenticated member (the node says whether it may have one), held for as long as
        the call lasts: its port first, then an announcement per incoming connection, and heartbeats."""
        await self._check_unary(context, request.sender)
        ack = await self.node.reserve(from_wire(request, ReserveRequest))
        slot = await self.relay.open(request.sender) if ack.ok and self.relay is not None else None
        if slot is None:
            yield pb.RelayEvent(reason=ack.reason if not ack.ok else "no_slot")
            return
        assert self.relay is not None
        try:
            yield pb.RelayEvent(address=slot.address, heartbeat_s=RELAY_HEARTBEAT_S, relay=self.relay.node_id)
            while True:
                try:
                    token = await asyncio.wait_for(slot.incoming.get(), RELAY_HEARTBEAT_S)
                except TimeoutError:
                    yield pb.RelayEvent()  # the slot is held: a heartbeat
                    continue
                if token is None:  # the relay gave the slot back (its --relay-bytes spent)
                    return
                yield pb.RelayEvent(token=token)
        finally:
            await self.relay.close(slot)

    async def Control(self, request: pb.ControlEnvelope, context: grpc.aio.ServicerContext) -> pb.ControlEnvelope:
        """A control message (:mod:`dfl_node.net.envelopes`), authenticated as the other unary calls are, read
        strictly (bounded first) before the node sees it; its handler's reply, or its refusal (counted) as a status."""
        await self._check_unary(context)
        try:
            message = opened(request)
            reply = await self.node.control(message)
        except TransferRejected as exc:
            self._refused(exc.reason, exc.detail, context.peer())
            await context.abort(refusal_status(exc.reason), f"{exc.reason}: {exc.detail}")
        return reply_sealed(kind_of(message), reply)

    # Assign and PassToken name no caller: a selecting sender binds its choice in its holder's name.
    async def Assign(self, request: pb.RoundAssignment, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._check_unary(context)
        if problem := _assignment_problem(request):
            self._refused("unknown_role", problem, request.holder[:64] or context.peer())
            return pb.Ack(ok=False, reason="unknown_role")
        ack = await self.node.assign(from_wire(request, Assignment))
        if not ack.ok:
            self._refused(ack.reason, f"{request.role[:40]!r} of round {request.round}, epoch {request.epoch}",
                          request.holder[:64] or context.peer())
        return to_wire(ack)

    async def PassToken(self, request: pb.RoundToken, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._check_unary(context)
        ack = await self.node.token(from_wire(request, Token))
        if not ack.ok:
            self._refused(ack.reason, f"token of round {request.round}, epoch {request.epoch}",
                          request.holder[:64] or context.peer())
        return to_wire(ack)


def _resumed(assembler: MessageAssembler, header: pb.TransferHeader, intake: Intake
             ) -> tuple[MessageAssembler, asyncio.Future[ModelMessage | None] | None]:
    """A push that resumes a cut one: the partial the node kept of it (then the stream goes on from there), or the
    confirmation of a message that had arrived whole (nothing to receive), or, if nothing of it is held, a fresh
    start."""
    if intake.arrived is not None:
        return assembler, intake.arrived
    held = intake.held
    if isinstance(held, MessageAssembler) and held.continues(header):
        held.resume(header, held.received)
        return held, None
    assembler.begin(header)
    return assembler, None


async def _ended(frames: AsyncIterator[ReadFrame]) -> None:
    """The rest of a stream that should carry nothing more (a resumed push whose payload had arrived whole)."""
    async for frame in frames:
        kind = "chunk" if isinstance(frame, memoryview) else frame.WhichOneof("kind")
        raise TransferRejected("trailing_data", f"a {kind or 'frame'} after a payload that had arrived whole")


async def _idle_limited(frames: AsyncIterator[ReadFrame], timeout: float) -> AsyncIterator[ReadFrame]:
    """``frames``, but a peer that sends nothing for ``timeout`` seconds is refused (``idle_timeout``):
    a half-open stream must not hold an aggregator's role, its memory reservation or a buffer."""
    iterator = aiter(frames)
    while True:
        try:
            async with asyncio.timeout(timeout):  # no task per frame, as wait_for would start: ~100 per 100 MB
                frame = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise TransferRejected("idle_timeout", f"no frame for {timeout:g} s") from None
        yield frame
