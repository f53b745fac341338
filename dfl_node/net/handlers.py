"""How gRPC reaches a servicer: one method handler per RPC, each with its request's codec, and a request
whose bytes do not decode refused as the peer's fault — for the node's own service
(:class:`~dfl_node.net.servicer.DflServicer`) and for the standard ones it serves (:mod:`dfl_node.net.standard`).

Apart from the servicer because it is about bytes and gRPC's registration API, not about what an RPC
means: a generated ``add_…Servicer_to_server`` decodes with ``FromString``, so gRPC logs an ERROR with a
traceback for every undecodable request (a fuzz run: 262 of them, 243 KB of log in a minute), and copies
every chunk through protobuf.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from dfl_node.net.frames import decode_frame, encode_frame
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.servicer import DflServicer

Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]  # request decoder, response encoder
OnRejected = Callable[[str, str, str], None]  # (reason, detail, sender): PeerHandler.on_rejected

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


def _parser(cls: type[Message]) -> Callable[[bytes], object]:
    def parse(raw: bytes) -> object:
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            return Undecodable(cls.DESCRIPTOR.name, str(exc)[:200])

    return parse


def _refusing_undecodable(on_rejected: OnRejected, name: str, behavior: Callable, *,
                          client_streams: bool, server_streams: bool) -> Callable:
    """``behavior``, but an :class:`Undecodable` request (in a client stream: message) is counted
    (``undecodable``) and answered INVALID_ARGUMENT without reaching the servicer: a peer's garbage is a
    refusal, not a server error."""
    async def refuse(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
        on_rejected("undecodable", f"{name}: not a {request.message} ({request.error})", context.peer())
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {request.message}")

    async def checked(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        async for request in requests:
            if isinstance(request, Undecodable):
                await refuse(request, context)
            yield request

    if client_streams and server_streams:
        async def streams(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
            async for item in behavior(checked(requests, context), context):
                yield item

        return streams

    if client_streams:
        async def client_stream(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> object:
            return await behavior(checked(requests, context), context)

        return client_stream

    if server_streams:
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


def service_handlers(service: ServiceDescriptor, servicer: object, on_rejected: OnRejected,
                     codecs: Mapping[Descriptor, Codec] | None = None) -> dict[str, grpc.RpcMethodHandler]:
    """What a generated ``add_…Servicer_to_server`` registers for ``service``, from its descriptor, except
    that every request that does not decode is refused by :func:`_refusing_undecodable`. ``codecs``: messages
    encoded another way (their decoder handles malformed bytes itself)."""
    codecs = codecs or {}

    def codec(message: Descriptor) -> Codec:
        if message in codecs:
            return codecs[message]
        cls = message_factory.GetMessageClass(message)
        return _parser(cls), cls.SerializeToString

    handlers = {}
    for method in service.methods:
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        behavior = getattr(servicer, method.name)
        if method.input_type not in codecs:
            behavior = _refusing_undecodable(on_rejected, method.name, behavior,
                                             client_streams=method.client_streaming,
                                             server_streams=method.server_streaming)
        handlers[method.name] = kind(
            behavior, request_deserializer=codec(method.input_type)[0],
            response_serializer=codec(method.output_type)[1],
        )  # fmt: skip
    return handlers


def method_handlers(servicer: DflServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The ``DflNode`` service's handlers: ``Frame`` streams use :mod:`~dfl_node.net.frames` (chunks without
    protobuf copies), and a request that does not decode is refused and counted by the node."""
    return service_handlers(pb.DESCRIPTOR.services_by_name["DflNode"], servicer, servicer.node.on_rejected,
                            {pb.Frame.DESCRIPTOR: (decode_frame, encode_frame)})


def register(server: grpc.aio.Server, service: ServiceDescriptor,
             handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Serve ``handlers`` as ``service`` (both of gRPC's registries, as generated code does)."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
