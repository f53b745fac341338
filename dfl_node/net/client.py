"""How a node reaches its peers: one :class:`PeerClient` per peer, for every RPC it makes to it.

The client half of the peer network port (:class:`~dfl_node.peering.port.PeerLink`): it takes and returns
the port's messages, converting them at this edge (:mod:`dfl_node.net.convert`), and turns gRPC's
failures into the port's (:mod:`dfl_node.peering.errors`). It streams a model out and reads the verdict
concurrently (:func:`open_transfer`), assembles and checks a reply or a pulled model as the server does
(:class:`~dfl_node.net.wire.WireIdentity`). With TLS (mutual TLS, or a swarm key's), the channel checks the
peer's certificate. The server side is :mod:`dfl_node.net.servicer` and :mod:`dfl_node.net.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.hashes import DEFAULT_HASH, negotiate
from dfl_node.net.auth import NO_SECURITY, Security
from dfl_node.net.codec import Outgoing, assemble
from dfl_node.net.convert import from_wire, to_wire
from dfl_node.net.frames import ReadFrame, WireFrame, decode_frame, encode_frame, wire_size
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.tls import handshake_failure
from dfl_node.net.wire import SERVICE_NAME, WireIdentity, channel_options, wire_bytes
from dfl_node.peering.errors import (
    PeerUnauthenticated,
    PeerUnreachable,
    TransferRefused,
    TransferRejected,
)
from dfl_node.peering.messages import Ack, Assignment, Hello, HelloReply, Ping, PingAck, PullRequest, Token
from dfl_node.peering.probes import ProbeReply, ProbeRequest


def why_unanswered(exc: grpc.aio.AioRpcError, timeout: float) -> str:
    """Why a call got no answer, in an operator's words (the rest of a log line "peer ADDRESS …"): gRPC
    says it in one UNAVAILABLE status with the resolver's or the socket's text inside."""
    details = (exc.details() or "")[:200]
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"does not answer within {timeout:g} s"
    if "resolv" in details.lower():  # "errors resolving …" (c-ares), "DNS resolution failed …" (native)
        return f"does not resolve ({details})"
    if "Connection refused" in details:
        return "refuses connections (nothing listens on that port)"
    return f"is unreachable ({exc.code().name}: {details})"


def _unreachable(exc: grpc.aio.AioRpcError, timeout: float) -> PeerUnreachable:
    return PeerUnreachable(exc.code().name.lower(), why_unanswered(exc, timeout))


async def open_transfer(
    transfer: grpc.aio.StreamStreamMultiCallable, frames: Iterable[WireFrame], timeout: float
) -> tuple[pb.TransferResult, grpc.aio.StreamStreamCall, int]:
    """Write ``frames`` while reading the peer's verdict; returns (verdict, call, bytes written).

    Writing and reading run concurrently because a receiver may refuse at the header (busy, wrong
    fingerprint…) and close the stream while we are still writing: the verdict must still reach us
    rather than a write error. After an acceptance every frame has been written.
    """
    call = transfer(timeout=timeout, wait_for_ready=True)
    sent = 0

    async def write_all() -> None:
        nonlocal sent
        for frame in frames:
            sent += wire_size(frame)
            await call.write(frame)
        await call.done_writing()

    writer = asyncio.get_running_loop().create_task(write_all())
    try:
        first = await call.read()
    except grpc.aio.AioRpcError:
        failed = writer.exception() if writer.done() and not writer.cancelled() else None
        if failed is not None:
            raise failed from None
        raise
    if not isinstance(first, pb.Frame) or first.WhichOneof("kind") != "result":
        writer.cancel()
        call.cancel()
        raise TransferRefused("protocol", "peer sent no result frame")
    if first.result.accepted:
        await writer
    else:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await writer
    return first.result, call, sent


async def _remaining(call: grpc.aio.StreamStreamCall | grpc.aio.UnaryStreamCall) -> AsyncIterator[ReadFrame]:
    """The rest of a response stream; ``read()`` and ``async for`` must not be mixed on one call."""
    while (frame := await call.read()) is not grpc.aio.EOF:
        yield frame


async def _refused(call: grpc.aio.StreamStreamCall | grpc.aio.UnaryStreamCall, result: pb.TransferResult
                   ) -> TransferRefused:
    """The peer's refusal, once its call has ended: cancelling the call at once would race the status the
    peer is sending (see :func:`~dfl_node.net.codec.assemble`)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for _ in _remaining(call):
            return TransferRefused("protocol", f"frames after a refusal ({result.reason})")
    return TransferRefused(result.reason, result.detail)


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
                 on_wrong_host: Callable[[str], None] | None = None) -> None:
        self.address = address
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
            raise _unreachable(exc, timeout) from exc

    async def _hello(self, request: pb.HelloRequest, timeout: float) -> pb.HelloReply:
        """Our hashes offered, and the one our pushes carry learnt from the reply."""
        request.hashes[:] = self.wire.hashes
        reply = await self.stub.Hello(request, timeout=timeout)
        self.hash = negotiate(self.wire.hashes, reply.hashes)
        return reply

    async def _reachable(self) -> None:
        """Until our channel is connected (at once if it is), else :class:`TransferRefused`: ``unreachable``,
        or ``closed`` when our node closed the channel meanwhile (it stops, or forgot the peer)."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self.connect_timeout)
        except TimeoutError:
            raise TransferRefused("unreachable", f"{self.address} did not accept a connection within "
                                                 f"{self.connect_timeout:g} s") from None
        except grpc.aio.UsageError:
            raise TransferRefused("closed", f"our channel to {self.address} was closed") from None

    # wait_for_ready on the round RPCs: the peer answered a heartbeat, so it is up, but our channel to it
    # may still be connecting (a new peer) or behind its reconnect backoff (a peer that just came back).
    async def _call(self, call: Callable[[], Awaitable[T]], timeout: float) -> T:
        """``call()``; gRPC's failure to reach the peer becomes the port's."""
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            raise _unreachable(exc, timeout) from exc

    async def _unary(self, method: grpc.aio.UnaryUnaryMultiCallable, message: Any, timeout: float) -> Any:
        """One round RPC: ``message`` to the wire, the call, its answer back to the port's type."""
        request = to_wire(message)
        return from_wire(await self._call(lambda: method(request, timeout=timeout, wait_for_ready=True), timeout))

    async def assign(self, assignment: Assignment, timeout: float) -> Ack:
        return await self._unary(self.stub.Assign, assignment, timeout)

    async def pass_token(self, token: Token, timeout: float) -> Ack:
        return await self._unary(self.stub.PassToken, token, timeout)

    async def probe(self, probe: ProbeRequest, timeout: float) -> ProbeReply:
        return await self._unary(self.stub.Probe, probe, timeout)

    async def ping(self, ping: Ping, timeout: float) -> PingAck:
        return await self._unary(self.stub.Ping, ping, timeout)

    async def push(self, message: ModelMessage, epoch: int, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None) -> tuple[ModelMessage | None, int, int]:
        """Stream ``message`` (encoded off the event loop) to the peer; returns (its reply model or None, bytes
        sent, bytes received) once the stream ended: the aggregator's confirmation of a durable fusion.

        Raises :class:`TransferRefused` when the peer refuses (``closed``: our channel closed under the call,
        as our node stops), :class:`PeerUnreachable` when it cannot be reached.
        """
        outgoing = await asyncio.to_thread(self.wire.prepare, message, epoch, self.hash)
        return await self.send(outgoing, timeout=timeout, on_accepted=on_accepted)

    async def send(self, outgoing: Outgoing, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None) -> tuple[ModelMessage | None, int, int]:
        """:meth:`push` of a message already encoded (:func:`~dfl_node.net.codec.prepare`)."""
        try:
            return await self._call(lambda: self._push(outgoing, timeout=timeout, on_accepted=on_accepted), timeout)
        except asyncio.CancelledError:  # the call, not the caller's task: our channel closed as the node stops
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise TransferRefused("closed", "our channel closed before it confirmed") from None

    async def _push(self, outgoing: Outgoing, *, timeout: float,
                    on_accepted: Callable[[], None] | None = None) -> tuple[ModelMessage | None, int, int]:
        await self._reachable()
        result, call, sent = await open_transfer(self.transfer, outgoing.frames(), timeout)
        try:
            if not result.accepted:
                raise await _refused(call, result)
            if on_accepted is not None:
                on_accepted()  # the aggregator has the message; its reply (if any) comes after its aggregation
            following = await call.read()
            if following is grpc.aio.EOF:
                return None, sent, 0  # no reply model: the normal case for Def-KT and FullAvg
            assembler = self.wire.assembler()
            assembler.feed(following)
            header, reply = await assemble(_remaining(call), assembler)
        except TransferRejected as exc:
            raise TransferRefused(exc.reason, f"reply from {self.address}: {exc.detail}") from exc
        finally:
            call.cancel()
        return reply, sent, wire_bytes(header)

    async def pull(self, request: PullRequest, *, timeout: float) -> tuple[ModelMessage, int]:
        """Fetch the peer's model for a pull group; returns (message, bytes received).

        Raises :class:`TransferRefused` when the peer refuses or sends something invalid,
        :class:`PeerUnreachable` when it is unreachable or dies mid-stream.
        """
        wire_request = to_wire(request)
        wire_request.hashes[:] = self.wire.hashes  # the source's model comes with a digest we accept
        return await self._call(lambda: self._pull(wire_request, timeout=timeout), timeout)

    async def _pull(self, request: pb.PullRequest, *, timeout: float) -> tuple[ModelMessage, int]:
        await self._reachable()
        call = self.pull_call(request, timeout=timeout, wait_for_ready=True)
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                raise TransferRefused("protocol", "the source sent nothing")
            if isinstance(first, pb.Frame) and first.WhichOneof("kind") == "result":
                raise await _refused(call, first.result)
            assembler = self.wire.assembler()
            assembler.feed(first)
            header, message = await assemble(_remaining(call), assembler)
        except TransferRejected as exc:
            raise TransferRefused(exc.reason, f"pulled from {self.address}: {exc.detail}") from exc
        finally:
            call.cancel()
        return message, wire_bytes(header)

    async def close(self) -> None:
        await self.channel.close()
