"""Control messages (:mod:`dfl_node.peering.control`) ⇄ ``ControlEnvelope``, and their refusals ⇄ gRPC statuses.

A control message crosses as its registered kind and its dataclass's fields as a JSON object, written and read by
pydantic from the dataclass itself (so a new kind needs no protobuf message and no converter) and read strictly: no
coercion (``"1"`` is no int), a missing field takes its default as protobuf's would, a field this node does not know is
ignored (a newer peer's), and the dataclass's own ``__post_init__`` checks run. A body is bounded (:data:`MAX_BODY`)
before anything of it is parsed; nothing is unpickled or imported.

A refusal travels as the call's status: ``INVALID_ARGUMENT`` for a message this node cannot read (``unknown_control``,
``bad_control``, ``control_too_large``), ``FAILED_PRECONDITION`` for a handler's refusal, both with ``reason: detail``;
a peer older than the Control RPC answers ``UNIMPLEMENTED``, which reads as ``unknown_control``.
"""

from __future__ import annotations

import functools
from typing import Any

import grpc
from pydantic import TypeAdapter, ValidationError

from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.control import ControlKind, kind_named, kind_of
from dfl_node.peering.errors import TransferRefused, TransferRejected

MAX_BODY = 64 * 1024  # bytes of a control message's (or a reply's) JSON: small requests, never a model
UNREADABLE = frozenset({"unknown_control", "bad_control", "control_too_large"})  # the caller's message, not the node


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    """The JSON of a control message's (or reply's) dataclass, built once per type."""
    return TypeAdapter(cls)


def _body(value: object, cls: type, kind: str) -> bytes:
    body = _adapter(cls).dump_json(value)
    if len(body) > MAX_BODY:
        raise ValueError(f"a {kind!r} control message of {len(body)} bytes, over {MAX_BODY}")
    return body


def _read(body: bytes, cls: type, kind: str) -> Any:
    """``body`` as a ``cls``, bounded then strictly validated; else :class:`TransferRejected`."""
    if len(body) > MAX_BODY:
        raise TransferRejected("control_too_large", f"a {kind!r} of {len(body)} bytes (at most {MAX_BODY})")
    try:
        return _adapter(cls).validate_json(body, strict=True)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False)[:3])
        raise TransferRejected("bad_control", f"{kind!r}: {problems}"[:300]) from None


def sealed(message: object) -> pb.ControlEnvelope:
    """Our control message's envelope. TypeError: ``message`` is of no registered kind; ValueError: over
    :data:`MAX_BODY`."""
    kind = kind_of(message)
    return pb.ControlEnvelope(kind=kind.name, body=_body(message, kind.message, kind.name))


def opened(envelope: pb.ControlEnvelope) -> object:
    """A peer's control message, or :class:`TransferRejected` (``unknown_control``, ``control_too_large``,
    ``bad_control``)."""
    kind = kind_named(envelope.kind)
    return _read(envelope.body, kind.message, kind.name)


def reply_sealed(kind: ControlKind, reply: object) -> pb.ControlEnvelope:
    """The envelope of our handler's ``reply`` to a ``kind`` (ValueError: over :data:`MAX_BODY`)."""
    return pb.ControlEnvelope(kind=kind.name, body=_body(reply, kind.reply, kind.name))


def reply_opened(kind: ControlKind, envelope: pb.ControlEnvelope) -> Any:
    """A peer's reply to our ``kind``, validated as that kind's reply type, or :class:`TransferRefused`."""
    if envelope.kind != kind.name:
        raise TransferRefused("bad_control", f"a reply of kind {envelope.kind[:64]!r} to a {kind.name!r}")
    try:
        return _read(envelope.body, kind.reply, kind.name)
    except TransferRejected as exc:
        raise TransferRefused(exc.reason, f"reply: {exc.detail}") from None


def refusal_status(reason: str) -> grpc.StatusCode:
    """The status a refusal of a control message travels as (see the module's docstring)."""
    return grpc.StatusCode.INVALID_ARGUMENT if reason in UNREADABLE else grpc.StatusCode.FAILED_PRECONDITION


def refusal(exc: grpc.aio.AioRpcError) -> TransferRefused | None:
    """The peer's refusal of our control message that ``exc`` says, or None where it is no refusal (the peer did
    not answer: the port's PeerUnreachable)."""
    code = exc.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return TransferRefused("unknown_control", "the peer answers no control messages (an older version)")
    if code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return None
    reason, _, detail = (exc.details() or "").partition(": ")
    return TransferRefused(reason[:64] or "refused", detail[:300])
