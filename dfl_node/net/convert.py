"""The port's messages ⇄ protobuf: every conversion between :mod:`dfl_node.peering`'s types and ``dfl_pb2``.

The domain messages mirror the proto's field by field under the same names, so one pair of functions
converts them all: maps become dicts, repeated fields tuples (of domain messages, where they repeat a message), a
nested message its own domain type, an
absent ``optional`` scalar None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf.message import Message

from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import (
    Ack,
    Assignment,
    DialBackRequest,
    Hello,
    HelloReply,
    MemberUpdate,
    Offer,
    Ping,
    PingAck,
    Progress,
    PullRequest,
    ReserveRequest,
    Token,
)
from dfl_node.peering.probes import ProbeReply, ProbeRequest

D = TypeVar("D")

_WIRE: dict[type, type[Message]] = {
    Hello: pb.HelloRequest, HelloReply: pb.HelloReply, Progress: pb.RoundProgress, Assignment: pb.RoundAssignment,
    Token: pb.RoundToken, Ack: pb.Ack, PullRequest: pb.PullRequest, ProbeRequest: pb.ProbeRequest,
    ProbeReply: pb.ProbeReply, MemberUpdate: pb.MemberUpdate, Ping: pb.MembershipPing, PingAck: pb.MembershipAck,
    DialBackRequest: pb.DialBackRequest, ReserveRequest: pb.ReserveRequest,
}
_DOMAIN: dict[type[Message], type] = {wire: domain for domain, wire in _WIRE.items()} | {pb.TransferHeader: Offer}


def to_wire(value: Any) -> Any:
    """The protobuf message of a domain message."""
    fields = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None:  # an ``optional`` field left out: absent on the wire
            continue
        fields[f.name] = (to_wire(v) if dataclasses.is_dataclass(v) else dict(v) if isinstance(v, Mapping)
                          else [to_wire(x) for x in v] if isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0])
                          else v)
    return _WIRE[type(value)](**fields)


def from_wire(message: Message, cls: type[D] | None = None) -> D:
    """The domain message of a protobuf message (``cls``: its domain type, where that is not the usual one)."""
    cls = cls or _DOMAIN[type(message)]
    by_name = message.DESCRIPTOR.fields_by_name
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        v, wire = getattr(message, f.name), by_name[f.name]
        if wire.message_type is not None and wire.message_type.GetOptions().map_entry:
            fields[f.name] = dict(v)
        elif wire.is_repeated and wire.message_type is not None:  # repeated messages: each its domain type
            fields[f.name] = tuple(from_wire(x) for x in v)
        elif wire.is_repeated:
            fields[f.name] = tuple(v)
        elif wire.message_type is not None:
            fields[f.name] = from_wire(v)
        elif wire.has_presence and not message.HasField(f.name):  # an ``optional`` scalar left out
            fields[f.name] = None
        else:
            fields[f.name] = v
    return cls(**fields)


def transfer_result(refusal: TransferRejected) -> pb.TransferResult:
    """The ``TransferResult`` a server sends back for a refusal."""
    return pb.TransferResult(accepted=False, reason=refusal.reason, detail=refusal.detail)
