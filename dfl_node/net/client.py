"""How a node reaches its peers: one :class:`PeerClient` per peer, for every RPC it makes to it.

The client half of the peer network port (:class:`~dfl_node.peering.port.PeerLink`): it takes and returns
the port's messages, converting them at this edge (:mod:`dfl_node.net.convert`), and turns gRPC's
failures into the port's (:mod:`dfl_node.net.call_failures`). It streams a model out and reads the verdict
concurrently (:mod:`dfl_node.net.client_streams`), assembles and checks a reply or a pulled model as the server
does (:class:`~dfl_node.net.wire.WireIdentity`). With TLS (mutual TLS, or a swarm key's), the channel checks the
peer's certificate. The server side is :mod:`dfl_node.net.servicer` and :mod:`dfl_node.net.server`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.hashes import DEFAULT_HASH, negotiate
from dfl_node.net.assembler import MessageAssembler, assemble
from dfl_node.net.auth import NO_SECURITY, Security
from dfl_node.net.call_failures import unreachable, was_cut
from dfl_node.net.client_streams import held_of, read_refusal, remaining, resume_at, write_for_verdict
from dfl_node.net.convert import from_wire, to_wire
from dfl_node.net.encoder import Outgoing, copy_header
from dfl_node.net.envelopes import refusal, reply_opened, sealed
from dfl_node.net.frames import ReadFrame, WireFrame, decode_frame, encode_frame, wire_size
from dfl_node.net.manifest import chunk_for
from dfl_node.net.pacing import NO_PACING, Pacing
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.tls import handshake_failure
from dfl_node.net.wire import SERVICE_NAME, WireIdentity, channel_options
from dfl_node.peering.control import kind_of
from dfl_node.peering.errors import (
    PeerError,
    PeerUnauthenticated,
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
    Ping,
    PingAck,
    PullRequest,
    Token,
)
from dfl_node.peering.probes import ProbeReply, ProbeRequest
from dfl_node.peering.resume import Resume

T = TypeVar("T")


class PeerClient:
    """One channel to one peer (a :class:`~dfl_node.peering.port.PeerLink`); cheap to keep per peer and reuse
    for every RPC.

    With TLS material (mutual TLS, or a swarm key's) the channel is mutual TLS, and the peer's certificate must be
    valid for ``tls_name`` (the node id we expect there) or, without one, for the host we dial.

    A push or a pull first waits for the channel to connect, for at most ``connect_timeout`` seconds: the
    calls themselves wait for a ready channel (``wait_for_ready``) up to their whole deadline, so a peer that
    does not accept the connection would otherwise hold the caller's role for a round timeout.

    Every Hello offers our payload hashes and learns the peer's (:attr:`hash`: what a push to it carries;
    sha256 until the peer has answered a Hello, or for a peer that offers none we know); a pull offers ours.
    """

    def __init__(self, address: str, wire: WireIdentity, security: Security = NO_SECURITY,
                 tls_name: str | None = None, connect_timeout: float = 5.0,
                 on_wrong_host: Callable[[str], None] | None = None, pacing: Pacing = NO_PACING) -> None:
        self.address = address
        self.pacing = pacing  # the node's caps: its pushes' chunks, and the replies and pulled models it reads
        self.on_wrong_host = on_wrong_host  # mTLS: told our address when the peer's certificate is not for its host
        self.connect_timeout = connect_timeout
        self.wire = wire
        self.checked_id = tls_name
        options: list[tuple[str, int | str]] = list(channel_options(wire.limits))
        if security.tls is not None:
            if tls_name:
                options.append(("grpc.ssl_target_name_override", tls_name))
            self.channel = grpc.aio.secure_channel(address, security.tls.channel_credentials(), options=options)
        else:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        self.hash = DEFAULT_HASH  # the payload digest our pushes to this peer carry (negotiated in Hello)
        self.stub = pb_grpc.DflNodeStub(self.channel)
        self.transfer = self.channel.stream_stream(
            f"/{SERVICE_NAME}/Transfer", request_serializer=encode_frame, response_deserializer=decode_frame
        )  # Frames through the fast chunk codec rather than the stub's protobuf serializers
        self.pull_call = self.channel.unary_stream(
            f"/{SERVICE_NAME}/Pull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=decode_frame,
        )  # fmt: skip

    async def hello(self, hello: Hello, timeout: float) -> HelloReply:
        """Our Hello and the peer's reply. :class:`~dfl_node.peering.errors.PeerUnauthenticated` when the peer
        does not prove who it is (``tls_handshake``: its certificate failed our checks, or ours its)."""
        try:
            return from_wire(await self._hello(to_wire(hello), timeout))
        except grpc.aio.AioRpcError as exc:
            if failure := handshake_failure(exc):
                if "Hostname" in failure and self.on_wrong_host is not None:
                    self.on_wrong_host(self.address)  # another node is there now: the host name, then its id
                raise PeerUnauthenticated("tls_handshake", failure) from exc
            raise unreachable(exc, timeout) from exc

    async def _hello(self, request: pb.HelloRequest, timeout: float) -> pb.HelloReply:
        """Our hashes offered, and the one our pushes carry learnt from the reply."""
        request.hashes[:] = self.wire.hashes
        reply = await self.stub.Hello(request, timeout=timeout)
        self.hash = negotiate(self.wire.hashes, reply.hashes)
        return reply

    async def _reachable(self, within: float | None = None) -> None:
        """Until our channel is connected (at once if it is), for at most ``within`` seconds (``connect_timeout``),
        else :class:`TransferRefused`: ``unreachable``, or ``closed`` when our node closed the channel meanwhile
        (it stops, or forgot the peer)."""
        within = self.connect_timeout if within is None else within
        try:
            await asyncio.wait_for(self.channel.channel_ready(), within)
        except TimeoutError:
            raise TransferRefused("unreachable", f"{self.address} did not accept a connection within "
                                                 f"{within:g} s") from None
        except grpc.aio.UsageError:
            raise TransferRefused("closed", f"our channel to {self.address} was closed") from None

    # wait_for_ready on the round RPCs: the peer answered a heartbeat, so it is up, but our channel to it
    # may still be connecting (a new peer) or behind its reconnect backoff (a peer that just came back).
    async def _call(self, call: Callable[[], Awaitable[T]], timeout: float) -> T:
        """``call()``; gRPC's failure to reach the peer becomes the port's."""
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            raise unreachable(exc, timeout) from exc

    async def _unary(self, method: grpc.aio.UnaryUnaryMultiCallable, message: Any, timeout: float) -> Any:
        """One round RPC: ``message`` to the wire, the call, its answer back to the port's type. The connection
        comes first, within ``connect_timeout``: an Assign's deadline is its whole role's, and an address that
        accepts nothing (a relayed peer's old slot, before gossip brings its new one) must not hold the holder's
        round for it."""
        return from_wire(await self._rpc(method, to_wire(message), timeout))

    async def _rpc(self, method: grpc.aio.UnaryUnaryMultiCallable, request: Any, timeout: float,
                   refused: Callable[[grpc.aio.AioRpcError], PeerError | None] = lambda exc: None) -> Any:
        """:meth:`_unary` in protobuf: the connection within ``connect_timeout``, then the call; a status that
        ``refused`` reads as the peer's refusal is raised as that, any other as :class:`PeerUnreachable`."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self._reachable(min(timeout, self.connect_timeout))
        except TransferRefused as exc:
            raise PeerUnreachable(exc.reason, exc.detail) from None
        left = max(timeout - (loop.time() - started), 1e-3)
        try:
            return await method(request, timeout=left, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise (refused(exc) or unreachable(exc, left)) from exc

    async def assign(self, assignment: Assignment, timeout: float) -> Ack:
        return await self._unary(self.stub.Assign, assignment, timeout)

    async def pass_token(self, token: Token, timeout: float) -> Ack:
        return await self._unary(self.stub.PassToken, token, timeout)

    async def probe(self, probe: ProbeRequest, timeout: float) -> ProbeReply:
        return await self._unary(self.stub.Probe, probe, timeout)

    async def ping(self, ping: Ping, timeout: float) -> PingAck:
        return await self._unary(self.stub.Ping, ping, timeout)

    async def dial_back(self, request: DialBackRequest, timeout: float) -> Ack:
        return await self._unary(self.stub.DialBack, request, timeout)

    async def call(self, message: object, timeout: float) -> Any:
        """A control message (:mod:`dfl_node.net.envelopes`) and the peer's reply, validated as its kind's reply."""
        request = sealed(message)
        reply = await self._rpc(self.stub.Control, request, timeout, refusal)
        return reply_opened(kind_of(message), reply)

    async def push(self, message: ModelMessage, epoch: int, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None,
                   resume: Resume | None = None) -> tuple[ModelMessage | None, int, int]:
        """Stream ``message`` (encoded off the event loop, once for all its attempts) to the peer; returns (its reply
        model or None, bytes sent, bytes received, over every attempt of ``resume``) once the stream ended: the
        aggregator's confirmation of a durable fusion.

        Raises :class:`TransferRefused` when the peer refuses (``closed``: our channel closed under the call,
        as our node stops), :class:`TransferCut` when the stream broke (call again with the same ``resume``: it goes
        on from what the peer holds), :class:`PeerUnreachable` when it cannot be reached.
        """
        resume = resume if resume is not None else Resume()
        if resume.prepared is None:
            resume.prepared = await asyncio.to_thread(self.wire.prepare, message, epoch, self.hash)
        return await self.send(resume.prepared, timeout=timeout, on_accepted=on_accepted, resume=resume)

    async def send(self, outgoing: Outgoing, *, timeout: float, on_accepted: Callable[[], None] | None = None,
                   resume: Resume | None = None) -> tuple[ModelMessage | None, int, int]:
        """:meth:`push` of a message already encoded (:func:`~dfl_node.net.encoder.prepare`)."""
        resume = resume if resume is not None else Resume(prepared=outgoing)
        resume.size = outgoing.header.ByteSize() + outgoing.header.total_size
        try:
            return await self._call(lambda: self._push(outgoing, timeout, on_accepted, resume), timeout)
        except asyncio.CancelledError:  # the call, not the caller's task: our channel closed as the node stops
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise TransferRefused("closed", "our channel closed before it confirmed") from None

    async def _push(self, outgoing: Outgoing, timeout: float, on_accepted: Callable[[], None] | None,
                    resume: Resume) -> tuple[ModelMessage | None, int, int]:
        """One attempt: the whole payload, or (after a cut) what the peer says it still needs; then the verdict and
        the reply (the rest of it, where a cut stream had brought its start)."""
        await self._reachable()
        resume.attempts += 1
        header, held = outgoing.header, held_of(resume)
        if resume.resuming or resume.chunk_bytes:
            header = copy_header(header, resume=resume.resuming, chunk_size=resume.chunk_bytes,
                                 reply_digest=held.digest if held else b"", reply_offset=held.received if held else 0)
        chunk = self.pacing.chunk(chunk_for(resume.chunk_bytes))
        call = self.transfer(timeout=timeout, wait_for_ready=True)

        def wrote(nbytes: int) -> None:
            resume.sent += nbytes
            resume.wrote += nbytes

        try:
            if resume.resuming:
                first = pb.Frame(header=header)
                await call.write(first)
                offset = await resume_at(call, header.total_size)
                resume.landed(offset, chunk)  # what the attempt before carried
                wrote(wire_size(first))
                frames: Iterable[WireFrame] = outgoing.chunks(offset, chunk)
            else:
                frames = itertools.chain([pb.Frame(header=header)], outgoing.chunks(0, chunk))
            result, _ = await write_for_verdict(call, frames, self.pacing, wrote)
            if not result.accepted:
                raise await read_refusal(call, result)
            resume.offset = header.total_size
            if on_accepted is not None:
                on_accepted()  # the aggregator has the message; its reply (if any) comes after its aggregation
            following = await call.read()
            if following is grpc.aio.EOF:
                return None, resume.sent, resume.received  # no reply model: the normal case (Def-KT, FullAvg)
            reply = await self._take(call, following, resume, "reply from")
        except grpc.aio.AioRpcError as exc:
            if was_cut(exc):
                raise TransferCut(f"{self.address}: {exc.details() or exc.code().name}") from exc
            raise
        finally:
            call.cancel()
        return reply, resume.sent, resume.received

    async def pull(self, request: PullRequest, *, timeout: float,
                   resume: Resume | None = None) -> tuple[ModelMessage, int]:
        """Fetch the peer's model for a pull group; returns (message, bytes received over every attempt of
        ``resume``).

        Raises :class:`TransferRefused` when the peer refuses or sends something invalid, :class:`TransferCut` when
        the stream broke (call again with the same ``resume``: the source goes on from what arrived, if it still
        serves that model), :class:`PeerUnreachable` when it is unreachable.
        """
        resume = resume if resume is not None else Resume()
        wire_request = to_wire(request)
        wire_request.hashes[:] = self.wire.hashes  # the source's model comes with a digest we accept
        wire_request.chunk_size = resume.chunk_bytes
        if held := held_of(resume):
            wire_request.digest, wire_request.offset = held.digest, held.received
        return await self._call(lambda: self._pull(wire_request, timeout, resume), timeout)

    async def _pull(self, request: pb.PullRequest, timeout: float, resume: Resume) -> tuple[ModelMessage, int]:
        await self._reachable()
        resume.attempts += 1
        call = self.pull_call(request, timeout=timeout, wait_for_ready=True)
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                raise TransferRefused("protocol", "the source sent nothing")
            if isinstance(first, pb.Frame) and first.WhichOneof("kind") == "result":
                raise await read_refusal(call, first.result)
            message = await self._take(call, first, resume, "pulled from")
        except grpc.aio.AioRpcError as exc:
            if was_cut(exc):
                raise TransferCut(f"{self.address}: {exc.details() or exc.code().name}") from exc
            raise
        finally:
            call.cancel()
        return message, resume.received

    async def _take(self, call: grpc.aio.StreamStreamCall | grpc.aio.UnaryStreamCall, first: ReadFrame,
                    resume: Resume, what: str) -> ModelMessage:
        """The model a stream carries from its ``first`` frame on (a reply, a pulled model), checked as the server
        checks a push. Where the stream goes on from what a cut one brought (its header's ``start``), that is taken
        up; where this one is cut too, what arrived is kept in ``resume`` for the next attempt."""
        held = resume.held if isinstance(resume.held, MessageAssembler) else None
        assembler = self.wire.assembler()
        received = 0
        try:
            header = first.header if isinstance(first, pb.Frame) and first.HasField("header") else None
            if header is not None and header.start and held is not None:
                held.resume(header)  # what we held of it, if this stream goes on from there: else bad_resume
                assembler = held
            else:
                assembler.feed(first)
            resume.held, start = assembler, assembler.received
            try:
                _, message = await assemble(remaining(call), assembler, self.pacing.received)
            finally:
                if assembler.header is not None:
                    received = assembler.received - start + assembler.header.ByteSize()
        except TransferRejected as exc:
            if exc.reason == "truncated" and assembler.header is not None:
                raise TransferCut(f"{what} {self.address}: {exc.detail}") from exc
            resume.held = None
            raise TransferRefused(exc.reason, f"{what} {self.address}: {exc.detail}") from exc
        finally:
            resume.received += received
        resume.held = None
        return message

    async def close(self) -> None:
        await self.channel.close()
