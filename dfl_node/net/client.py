"""How a node reaches its peers: one :class:`PeerClient` per peer, for every RPC it makes to it.

The client half of the peer network port (:class:`~dfl_node.peering.port.PeerLink`): it takes and returns
the port's messages, converting them at this edge (:mod:`dfl_node.net.convert`), and turns gRPC's
failures into the port's (:mod:`dfl_node.peering.errors`). It streams a model out and reads the verdict
concurrently (:func:`open_transfer`), assembles and checks a reply or a pulled model as the server does
(:class:`~dfl_node.net.wire.WireIdentity`), and, with a swarm key, authenticates its connection before the
round RPCs. The server side is :mod:`dfl_node.net.servicer` and :mod:`dfl_node.net.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.hashes import DEFAULT_HASH, negotiate
from dfl_node.net import psk
from dfl_node.net.auth import NO_SECURITY, Security
from dfl_node.net.codec import Outgoing, assemble
from dfl_node.net.convert import from_wire, to_wire
from dfl_node.net.frames import ReadFrame, WireFrame, decode_frame, encode_frame, wire_size
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.psk import check_reply, sign_request
from dfl_node.net.tls import handshake_failure
from dfl_node.net.wire import SERVICE_NAME, WireIdentity, channel_options, wire_bytes
from dfl_node.peering.errors import (
    AUTH_REQUIRED,
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


def _unauthenticated(exc: Exception) -> bool:
    """The peer refused a call because our connection has not (or no longer) authenticated."""
    if isinstance(exc, TransferRefused):
        return exc.reason == "unauthenticated"
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAUTHENTICATED


class PeerClient:
    """One channel to one peer (a :class:`~dfl_node.peering.port.PeerLink`); cheap to keep per peer and reuse
    for every RPC.

    With TLS material the channel is mutual TLS, and the peer's certificate must be valid for
    ``tls_name`` (the node id we expect there) or, without one, for the host we dial. With a swarm key,
    :meth:`hello` runs the challenge–response (:mod:`dfl_node.net.psk`), and the round RPCs make sure
    our connection authenticated first (a Hello from ``hello_message``) whenever the peer would refuse the
    call — and count the refusal as an intruder's — otherwise (:meth:`_session_usable`); once more if it
    refuses all the same (our connection dropped between that check and the call).

    A push or a pull first waits for the channel to connect, for at most ``connect_timeout`` seconds: the
    calls themselves wait for a ready channel (``wait_for_ready``) up to their whole deadline, so a peer that
    does not accept the connection would otherwise hold the caller's role for a round timeout.

    Every Hello offers our payload hashes and learns the peer's (:attr:`hash`: what a push to it carries;
    sha256 until the peer has answered a Hello, or for a peer that offers none we know); a pull offers ours.
    """

    def __init__(self, address: str, wire: WireIdentity, security: Security = NO_SECURITY,
                 tls_name: str | None = None, hello_message: Callable[[], Hello] | None = None,
                 connect_timeout: float = 5.0, on_wrong_host: Callable[[str], None] | None = None) -> None:
        self.address = address
        self.on_wrong_host = on_wrong_host  # mTLS: told our address when the peer's certificate is not for its host
        self.connect_timeout = connect_timeout
        self.wire = wire
        self.checked_id = tls_name
        options: list[tuple[str, int | str]] = list(channel_options(wire.limits))
        if security.swarm_key is not None:  # our own connection: the one our Hello authenticates
            options.append(("grpc.use_local_subchannel_pool", 1))
        if security.tls is not None:
            if tls_name:
                options.append(("grpc.ssl_target_name_override", tls_name))
            self.channel = grpc.aio.secure_channel(address, security.tls.channel_credentials(), options=options)
        else:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        self.swarm_key = security.swarm_key
        self.challenge: bytes | None = None  # swarm key: the peer's last challenge, answered by our next Hello
        self.authenticated_at: float | None = None  # swarm key: when we sent the last Hello the peer accepted
        self.hello_message = hello_message
        self.hash = DEFAULT_HASH  # the payload digest our pushes to this peer carry (negotiated in Hello)
        self._auth_lock = asyncio.Lock()
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

    async def _hello(self, request: pb.HelloRequest, timeout: float, wait_for_ready: bool = False) -> pb.HelloReply:
        """Our hashes offered, and the one our pushes carry learnt from the reply (:meth:`_hello_once`)."""
        request.hashes[:] = self.wire.hashes
        reply = await self._hello_once(request, timeout, wait_for_ready)
        self.hash = negotiate(self.wire.hashes, reply.hashes)
        return reply

    async def _hello_once(self, request: pb.HelloRequest, timeout: float, wait_for_ready: bool) -> pb.HelloReply:
        """With a swarm key: signed with the peer's last challenge (at first contact the peer answers
        ``auth_required`` with one and we ask again), and the reply must prove the key over our nonce,
        else :class:`~dfl_node.peering.errors.PeerUnauthenticated`."""
        if self.swarm_key is None:
            return await self.stub.Hello(request, timeout=timeout, wait_for_ready=wait_for_ready)
        async with self._auth_lock:  # one challenge, one Hello: concurrent Hellos would reuse it (a replay)
            for _ in range(2):
                signed = sign_request(self.swarm_key, request, self.challenge)
                self.challenge = None
                sent_at = time.monotonic()  # the peer's session runs from its receipt, a little later
                reply = await self.stub.Hello(signed, timeout=timeout, wait_for_ready=wait_for_ready)
                check_reply(self.swarm_key, signed, reply)
                self.challenge = reply.auth_nonce
                if reply.reason != AUTH_REQUIRED:
                    break
            self.authenticated_at = sent_at if reply.accepted else None
            return reply

    def _session_usable(self) -> bool:
        """Whether the peer will serve our next call without a Hello first: it accepted our last one, the
        channel is still connected (else the call opens a new connection, which no Hello authenticated: the
        peer was not up yet, or it restarted), and that session is younger than half its lifetime
        (``SESSION_TTL_S``: only our own Hellos renew it, and a node sends none to a peer with a lower id
        while that peer says Hello to it)."""
        return (self.authenticated_at is not None
                and time.monotonic() - self.authenticated_at < psk.SESSION_TTL_S / 2
                and self.channel.get_state() is grpc.ChannelConnectivity.READY)

    async def _authenticated(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` on a connection that proved the swarm key (a no-op without one)."""
        if self.swarm_key is None or self.hello_message is None:
            return await call()
        if not self._session_usable():
            await self._authenticate()
        try:
            return await call()
        except (grpc.aio.AioRpcError, TransferRefused) as exc:
            if not _unauthenticated(exc):
                raise
        await self._authenticate()  # our connection dropped and came back meanwhile: authenticate anew, once
        return await call()

    async def _authenticate(self) -> None:
        """A Hello that waits for our channel to connect (up to ``connect_timeout``), as the call after it will:
        one sent while the channel is down fails at once, and the call would then reach the peer unauthenticated."""
        assert self.hello_message is not None
        with contextlib.suppress(grpc.aio.AioRpcError, PeerUnauthenticated):  # then the call itself is refused
            await self._hello(to_wire(self.hello_message()), timeout=self.connect_timeout, wait_for_ready=True)

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
        """``call()`` on an authenticated connection; gRPC's failure to reach the peer becomes the port's."""
        try:
            return await self._authenticated(call)
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
