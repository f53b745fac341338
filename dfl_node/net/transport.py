"""Where bytes cross the wire: the gRPC server of a node and the client it uses to reach its peers.

The server turns RPCs into calls on a :class:`NodeHandler` (implemented by the daemon) and does
all the byte work itself: it validates the stream with :class:`MessageAssembler` *before* the node
sees a model, counts rejections, and streams replies back. The standard gRPC health service and
server reflection are enabled so that ordinary gRPC tools can inspect a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.plan import Role
from dfl_node.net.codec import (
    BufferPool, Limits, Manifest, MessageAssembler, Outgoing, Resolver, TransferRejected, assemble, prepare,
)
from dfl_node.net.auth import NO_SECURITY, Authenticator, Security
from dfl_node.net.frames import ReadFrame, WireFrame, decode_frame, encode_frame, wire_size
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.proto import dfl_pb2_grpc as pb_grpc
from dfl_node.net.psk import AUTH_REQUIRED, PeerUnauthenticated, check_reply, sign_request

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DflNode"].full_name


def channel_options(limits: Limits) -> list[tuple[str, int]]:
    """Explicit message limits (gRPC's 4 MiB default fails with a misleading INTERNAL error) and fast reconnects."""
    return [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        # A peer that restarts must be reachable again within a heartbeat or two, not after gRPC's
        # default exponential reconnect backoff (up to 120 s) on the channel we keep to it.
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


@dataclass(frozen=True)
class WireIdentity:
    """What a received model must agree with: our swarm, and our architecture (``model``, its fingerprint
    and manifest) or another one that ``resolve`` builds from our registry for an algorithm that fuses it."""

    swarm: str
    model: str
    fingerprint: str
    manifest: Manifest
    limits: Limits
    resolve: Resolver | None = field(default=None, compare=False)
    buffers: BufferPool = field(default_factory=BufferPool, compare=False)  # receive buffers, reused across transfers

    def assembler(self) -> MessageAssembler:
        return MessageAssembler(
            swarm=self.swarm, fingerprint=self.fingerprint, manifest=self.manifest, limits=self.limits,
            buffers=self.buffers, model=self.model, resolve=self.resolve,
        )  # fmt: skip

    def fingerprint_of(self, model: str) -> str:
        """The fingerprint a ``model`` model has here (a FedAvg reply may be of another architecture);
        ``ValueError`` for an architecture this node cannot fuse."""
        if model == self.model:
            return self.fingerprint
        if self.resolve is None:
            raise ValueError(f"{model!r} is not our architecture ({self.model})")
        return self.resolve(model)[0]

    def prepare(self, message: ModelMessage, epoch: int = 0) -> Outgoing:
        """The frames of ``message``, encoded from CPU tensors (a model on another device is copied here)."""
        message = on_device(message, "cpu")
        return prepare(message, swarm=self.swarm, fingerprint=self.fingerprint_of(message.model), epoch=epoch)


class Intake(Protocol):
    """One admitted transfer: the node takes its message (or learns that it never came)."""

    async def deliver(self, message: ModelMessage) -> asyncio.Future[ModelMessage | None] | None: ...
    def abandon(self) -> None: ...


class NodeHandler(Protocol):
    """The daemon side of the RPCs; every method runs on the event loop."""

    wire: WireIdentity
    idle_timeout: float  # a Transfer stream silent this long is dropped: it never holds a role or a buffer

    # A Hello; ``refused``: why the Authenticator refuses it (the node counts it and answers with its identity).
    def hello(self, request: pb.HelloRequest, peer: str, refused: str | None = None) -> pb.HelloReply: ...
    # Whether this transfer is wanted (raise TransferRejected, e.g. "not_expected"). Its Intake's deliver()
    # checks the message for the algorithm (raise TransferRejected) and returns a future of the reply (None:
    # no reply), resolved once the fusion is durable, or failed with TransferRejected if it never happens;
    # abandon() is called instead when the stream fails after admission.
    async def admit(self, header: pb.TransferHeader) -> Intake: ...
    async def pull(self, request: pb.PullRequest) -> ModelMessage: ...  # raise TransferRejected (e.g. "busy")
    async def probe(self, request: pb.ProbeRequest) -> pb.ProbeReply: ...  # a selection probe (001); never raises
    def on_rejected(self, reason: str, detail: str, sender: str) -> None: ...
    def on_transferred(self, sent: int, received: int) -> None: ...  # byte counters
    async def assign(self, request: pb.RoundAssignment) -> pb.Ack: ...
    async def token(self, request: pb.RoundToken) -> pb.Ack: ...


def _wire_bytes(header: pb.TransferHeader) -> int:
    return header.total_size + header.ByteSize()


# Refusals that a node answers (a Pull's result, a ProbeReply, an Ack) rather than raises, and that the servicer
# counts: all but a busy node (counted apart, busy_refusals), a sender's own transfer that failed (an outcome of
# the role it took, not a refusal) and a bad probe (the node counts it where it knows the detail).
_COUNTED_ELSEWHERE = frozenset({"busy", "transfer_failed", "bad_probe"})


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
    def __init__(self, node: NodeHandler, auth: Authenticator | None = None) -> None:
        self.node = node
        self.auth = auth or Authenticator()  # mTLS / swarm key: who may call, as whom (dfl_node.net.auth)

    async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
        reply = self.node.hello(request, context.peer(), self.auth.hello(request, context))
        self.auth.sign(request, reply)
        return reply

    def _refuse(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> TransferRejected | None:
        """A refusal (counted) of an RPC whose connection has not authenticated, or that names another sender."""
        refusal = self.auth.refusal(context, claimed)
        if refusal is None:
            return None
        self.node.on_rejected(*refusal, claimed or context.peer())
        return TransferRejected(*refusal)

    def _refused(self, reason: str, detail: str, who: str) -> None:
        """Count a refusal that the node answered rather than raised (see ``_COUNTED_ELSEWHERE``)."""
        if reason not in _COUNTED_ELSEWHERE:
            self.node.on_rejected(reason, detail, who)

    async def _check_unary(self, context: grpc.aio.ServicerContext, claimed: str | None = None) -> None:
        refused = self._refuse(context, claimed)
        if refused is not None:
            code = grpc.StatusCode.UNAUTHENTICATED if refused.reason == "unauthenticated" else grpc.StatusCode.PERMISSION_DENIED
            await context.abort(code, f"{refused.reason}: {refused.detail}")

    async def Transfer(
        self, request_iterator: AsyncIterator[ReadFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[WireFrame]:
        wire = self.node.wire
        assembler = wire.assembler()
        frames = _idle_limited(request_iterator, self.node.idle_timeout)
        intake: Intake | None = None
        try:
            first = await anext(frames, None)
            if first is None:
                raise TransferRejected("truncated", "empty stream")
            claimed = first.header.sender if isinstance(first, pb.Frame) and first.HasField("header") else None
            if refused := self._refuse(context, claimed):
                raise refused  # unauthenticated, or in another's name: nothing more of it is parsed
            assembler.feed(first)  # the header: swarm, fingerprint, manifest, sizes checked here
            intake = await self.node.admit(assembler.header)
            header, message = await assemble(frames, assembler)
            self.node.on_transferred(0, _wire_bytes(header))
            pending_reply = await intake.deliver(message)
            intake = None  # delivered: from here the aggregator owns the message, even if this RPC is cancelled
        except TransferRejected as exc:
            sender = assembler.header.sender if assembler.header is not None else "?"
            if exc.reason not in ("unauthenticated", "identity_mismatch"):  # those are counted by _refuse
                self.node.on_rejected(exc.reason, exc.detail, sender)
            yield pb.Frame(result=exc.result())
            return
        except Exception:  # a bug, not the peer's fault: say where (gRPC would only answer UNKNOWN), keep serving
            log.exception("Transfer from %s failed", assembler.header.sender if assembler.header else "?")
            raise
        finally:
            if intake is not None:
                intake.abandon()
        yield pb.Frame(result=pb.TransferResult(accepted=True))  # validated and taken for aggregation
        try:  # resolves once the fusion is durable: the end of this stream is the sender's confirmation
            reply = await pending_reply if pending_reply is not None else None
        except TransferRejected as exc:  # the group ended without fusing it: an error status, never a clean end
            await context.abort(grpc.StatusCode.ABORTED, f"{exc.reason}: {exc.detail}")
        if reply is not None:
            async for frame in self._stream(reply):
                yield frame

    async def _stream(self, message: ModelMessage) -> AsyncIterator[WireFrame]:
        outgoing = await asyncio.to_thread(self.node.wire.prepare, message)
        sent = 0
        for frame in outgoing.frames():
            sent += wire_size(frame)
            yield frame
        self.node.on_transferred(sent, 0)

    async def Pull(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[WireFrame]:
        if refused := self._refuse(context, request.aggregator):
            yield pb.Frame(result=refused.result())
            return
        try:
            message = await self.node.pull(request)
        except TransferRejected as exc:
            self._refused(exc.reason, exc.detail, request.aggregator[:64] or context.peer())
            yield pb.Frame(result=exc.result())
            return
        async for frame in self._stream(message):
            yield frame

    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeReply:
        await self._check_unary(context, request.sender)
        reply = await self.node.probe(request)
        if not reply.ok:
            self._refused(reply.reason, f"probe of round {request.round}", request.sender[:64] or context.peer())
        return reply

    # Assign and PassToken name no caller: a selecting sender binds its choice in its holder's name.
    async def Assign(self, request: pb.RoundAssignment, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._check_unary(context)
        if problem := _assignment_problem(request):
            self._refused("unknown_role", problem, request.holder[:64] or context.peer())
            return pb.Ack(ok=False, reason="unknown_role")
        ack = await self.node.assign(request)
        if not ack.ok:
            self._refused(ack.reason, f"{request.role[:40]!r} of round {request.round}, epoch {request.epoch}",
                          request.holder[:64] or context.peer())
        return ack

    async def PassToken(self, request: pb.RoundToken, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._check_unary(context)
        ack = await self.node.token(request)
        if not ack.ok:
            self._refused(ack.reason, f"token of round {request.round}, epoch {request.epoch}",
                          request.holder[:64] or context.peer())
        return ack


_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True)
class Undecodable:
    """A request whose bytes are not the method's message: what the deserializer hands the handler
    instead of raising (gRPC would log an ERROR with a traceback for every such request)."""

    message: str
    error: str


def _parser(cls: type) -> Callable[[bytes], object]:
    def parse(raw: bytes) -> object:
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            return Undecodable(cls.DESCRIPTOR.name, str(exc)[:200])

    return parse


def _refusing_undecodable(servicer: DflServicer, name: str, behavior: Callable, streams: bool) -> Callable:
    """``behavior``, but an :class:`Undecodable` request is counted (``undecodable``) and answered
    INVALID_ARGUMENT without reaching the node: a peer's garbage is a refusal, not a server error."""
    async def refuse(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
        servicer.node.on_rejected("undecodable", f"{name}: not a {request.message} ({request.error})", context.peer())
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {request.message}")

    if streams:
        async def stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
            if isinstance(request, Undecodable):
                await refuse(request, context)
            async for item in behavior(request, context):
                yield item

        return stream

    async def unary(request: object, context: grpc.aio.ServicerContext) -> object:
        if isinstance(request, Undecodable):
            await refuse(request, context)
        return await behavior(request, context)

    return unary


def _method_handlers(servicer: DflServicer) -> dict[str, grpc.RpcMethodHandler]:
    """What the generated ``add_DflNodeServicer_to_server`` registers, from the same descriptor, except
    that ``Frame`` streams use :mod:`~dfl_node.net.frames` (chunks without protobuf copies) and that a
    request that does not decode is refused by :func:`_refusing_undecodable`."""
    def codec(message: object) -> tuple[Callable, Callable]:
        if message is pb.Frame.DESCRIPTOR:
            return decode_frame, encode_frame
        cls = getattr(pb, message.name)
        return _parser(cls), cls.SerializeToString

    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["DflNode"].methods:
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        behavior = getattr(servicer, method.name)
        if not method.client_streaming:
            behavior = _refusing_undecodable(servicer, method.name, behavior, method.server_streaming)
        handlers[method.name] = kind(
            behavior, request_deserializer=codec(method.input_type)[0],
            response_serializer=codec(method.output_type)[1],
        )  # fmt: skip
    return handlers


async def start_server(node: NodeHandler, host: str, port: int,
                       security: Security = NO_SECURITY) -> tuple[grpc.aio.Server, int]:
    """Serve the node (plus health and reflection) on ``host:port``; returns the server and the bound port.
    With TLS material in ``security`` the port speaks mutual TLS only (a client certificate signed by the
    swarm CA is required); with a swarm key, RPCs other than Hello need an authenticated connection.

    SO_REUSEPORT is off (gRPC turns it on by default): with it, a second node on a port in use
    would bind too, and the kernel would split the connections between the two.
    """
    server = grpc.aio.server(options=[*channel_options(node.wire.limits), ("grpc.so_reuseport", 0)])
    handlers = _method_handlers(DflServicer(node, Authenticator(security)))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if security.tls is not None:
        bound = server.add_secure_port(f"{host}:{port}", security.tls.server_credentials())
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {host}:{port}")
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def _idle_limited(frames: AsyncIterator[ReadFrame], timeout: float) -> AsyncIterator[ReadFrame]:
    """``frames``, but a peer that sends nothing for ``timeout`` seconds is refused (``idle_timeout``):
    a half-open stream must not hold an aggregator's role, its memory reservation or a buffer."""
    iterator = aiter(frames)
    while True:
        try:
            frame = await asyncio.wait_for(anext(iterator), timeout)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise TransferRejected("idle_timeout", f"no frame for {timeout:g} s") from None
        yield frame


class TransferRefused(Exception):
    """The receiving peer said no (busy, incompatible, invalid); ``reason`` is its stable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


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
        if writer.done() and not writer.cancelled() and writer.exception():
            raise writer.exception() from None
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


async def _remaining(call: grpc.aio.StreamStreamCall) -> AsyncIterator[ReadFrame]:
    """The rest of a response stream; ``read()`` and ``async for`` must not be mixed on one call."""
    while (frame := await call.read()) is not grpc.aio.EOF:
        yield frame


T = TypeVar("T")


def _unauthenticated(exc: Exception) -> bool:
    """The peer refused a call because our connection has not (or no longer) authenticated."""
    if isinstance(exc, TransferRefused):
        return exc.reason == "unauthenticated"
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAUTHENTICATED


class PeerClient:
    """One channel to one peer; cheap to keep per peer and reuse for every RPC.

    With TLS material the channel is mutual TLS, and the peer's certificate must be valid for
    ``tls_name`` (the node id we expect there) or, without one, for the host we dial. With a swarm key,
    :meth:`hello` runs the challenge–response (:mod:`dfl_node.net.psk`), and the round RPCs make sure
    our connection authenticated first (a Hello from ``hello_message``), once more if the peer says it
    no longer is (it restarted, or our connection is new).
    """

    def __init__(self, address: str, wire: WireIdentity, security: Security = NO_SECURITY,
                 tls_name: str | None = None, hello_message: Callable[[], pb.HelloRequest] | None = None) -> None:
        self.address = address
        self.wire = wire
        self.tls_name = tls_name
        options = channel_options(wire.limits)
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
        self.authenticated = False  # swarm key: whether our connection proved it (the peer accepted our Hello)
        self.hello_message = hello_message
        self._auth_lock = asyncio.Lock()
        self.stub = pb_grpc.DflNodeStub(self.channel)
        self.transfer = self.channel.stream_stream(
            f"/{SERVICE_NAME}/Transfer", request_serializer=encode_frame, response_deserializer=decode_frame
        )  # Frames through the fast chunk codec rather than the stub's protobuf serializers
        self.pull_call = self.channel.unary_stream(
            f"/{SERVICE_NAME}/Pull", request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=decode_frame,
        )  # fmt: skip

    async def hello(self, request: pb.HelloRequest, timeout: float) -> pb.HelloReply:
        """Our Hello and the peer's reply. With a swarm key: signed with the peer's last challenge (at first
        contact the peer answers ``auth_required`` with one and we ask again), and the reply must prove the
        key over our nonce, else :class:`~dfl_node.net.psk.PeerUnauthenticated`."""
        if self.swarm_key is None:
            return await self.stub.Hello(request, timeout=timeout)
        async with self._auth_lock:  # one challenge, one Hello: concurrent Hellos would reuse it (a replay)
            for _ in range(2):
                signed = sign_request(self.swarm_key, request, self.challenge)
                self.challenge = None
                reply = await self.stub.Hello(signed, timeout=timeout)
                check_reply(self.swarm_key, signed, reply)
                self.challenge = reply.auth_nonce
                if reply.reason != AUTH_REQUIRED:
                    break
            self.authenticated = reply.accepted
            return reply

    async def _authenticated(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` on a connection that proved the swarm key (a no-op without one)."""
        if self.swarm_key is None or self.hello_message is None:
            return await call()
        if not self.authenticated:
            await self._authenticate()
        try:
            return await call()
        except (grpc.aio.AioRpcError, TransferRefused) as exc:
            if not _unauthenticated(exc):
                raise
        self.authenticated = False  # the peer restarted, or gRPC reconnected: authenticate anew, once
        await self._authenticate()
        return await call()

    async def _authenticate(self) -> None:
        assert self.hello_message is not None
        with contextlib.suppress(grpc.aio.AioRpcError, PeerUnauthenticated):  # then the call itself is refused
            await self.hello(self.hello_message(), timeout=5.0)

    # wait_for_ready on the round RPCs: the peer answered a heartbeat, so it is up, but our channel to it
    # may still be connecting (a new peer) or behind its reconnect backoff (a peer that just came back).
    async def assign(self, request: pb.RoundAssignment, timeout: float) -> pb.Ack:
        return await self._authenticated(lambda: self.stub.Assign(request, timeout=timeout, wait_for_ready=True))

    async def pass_token(self, request: pb.RoundToken, timeout: float) -> pb.Ack:
        return await self._authenticated(lambda: self.stub.PassToken(request, timeout=timeout, wait_for_ready=True))

    async def probe(self, request: pb.ProbeRequest, timeout: float) -> pb.ProbeReply:
        return await self._authenticated(lambda: self.stub.Probe(request, timeout=timeout, wait_for_ready=True))

    async def push(self, outgoing: Outgoing, *, timeout: float,
                   on_accepted: Callable[[], None] | None = None) -> tuple[ModelMessage | None, int, int]:
        """Stream a message prepared by :func:`~dfl_node.net.codec.prepare` to the peer; returns (its reply model or None, bytes sent, bytes received).

        Raises :class:`TransferRefused` when the peer refuses, ``grpc.aio.AioRpcError`` when it is unreachable.
        """
        return await self._authenticated(lambda: self._push(outgoing, timeout=timeout, on_accepted=on_accepted))

    async def _push(self, outgoing: Outgoing, *, timeout: float,
                    on_accepted: Callable[[], None] | None = None) -> tuple[ModelMessage | None, int, int]:
        """Stream a message prepared by :func:`~dfl_node.net.codec.prepare` to the peer; returns (its reply model or None, bytes sent, bytes received).

        Raises :class:`TransferRefused` when the peer refuses, ``grpc.aio.AioRpcError`` when it is unreachable.
        """
        result, call, sent = await open_transfer(self.transfer, outgoing.frames(), timeout)
        try:
            if not result.accepted:
                raise TransferRefused(result.reason, result.detail)
            if on_accepted is not None:
                on_accepted()  # the aggregator has the message; its reply (if any) comes after its aggregation
            following = await call.read()
            if following is grpc.aio.EOF:
                return None, sent, 0  # no reply model: the normal case for Def-KT and FullAvg
            assembler = self.wire.assembler()
            assembler.feed(following)
            header, reply = await assemble(_remaining(call), assembler, until_eof=False)
        except TransferRejected as exc:
            raise TransferRefused(exc.reason, f"reply from {self.address}: {exc.detail}") from exc
        finally:
            call.cancel()
        return reply, sent, _wire_bytes(header)

    async def pull(self, request: pb.PullRequest, *, timeout: float) -> tuple[ModelMessage, int]:
        """Fetch the peer's model for a pull group; returns (message, bytes received).

        Raises :class:`TransferRefused` when the peer refuses or sends something invalid,
        ``grpc.aio.AioRpcError`` when it is unreachable or dies mid-stream.
        """
        return await self._authenticated(lambda: self._pull(request, timeout=timeout))

    async def _pull(self, request: pb.PullRequest, *, timeout: float) -> tuple[ModelMessage, int]:
        call = self.pull_call(request, timeout=timeout, wait_for_ready=True)
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                raise TransferRefused("protocol", "the source sent nothing")
            if isinstance(first, pb.Frame) and first.WhichOneof("kind") == "result":
                raise TransferRefused(first.result.reason, first.result.detail)
            assembler = self.wire.assembler()
            assembler.feed(first)
            header, message = await assemble(_remaining(call), assembler, until_eof=False)
        except TransferRejected as exc:
            raise TransferRefused(exc.reason, f"pulled from {self.address}: {exc.detail}") from exc
        finally:
            call.cancel()
        return message, _wire_bytes(header)

    async def close(self) -> None:
        await self.channel.close()
