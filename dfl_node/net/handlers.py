"""How gRPC reaches a :class:`~dfl_node.net.servicer.DflServicer`: one method handler per RPC, each with
its request's codec, and a request whose bytes do not decode refused as the peer's fault.

Apart from the servicer because it is about bytes and gRPC's registration API, not about what an RPC
means: the generated ``add_DflNodeServicer_to_server`` would log an ERROR with a traceback for every
undecodable request and copy every chunk through protobuf.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from dfl_node.net.frames import decode_frame, encode_frame
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.servicer import DflServicer

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


def method_handlers(servicer: DflServicer) -> dict[str, grpc.RpcMethodHandler]:
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
