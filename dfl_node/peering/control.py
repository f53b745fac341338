"""Control messages: a small request and its reply between peers, each added as its definition and its handler.

A control message is a frozen dataclass, as the port's other messages (:mod:`dfl_node.peering.messages`), registered
under a stable kind name with its reply's type; what a node answers it is an ``async`` function registered for its
type, given the node's :class:`~dfl_node.peering.port.PeerHandler` (a daemon's and the simulator's:
:class:`~dfl_node.node.requests.PeerRequests`) and the message::

    @control_message("echo", reply=EchoReply)
    @dataclass(frozen=True, kw_only=True)
    class Echo:
        text: str = ""

    @handles(Echo)
    async def echo(node: Any, message: Echo) -> EchoReply:
        return EchoReply(text=message.text)

Every network carries every registered kind through one call each way (:meth:`PeerLink.call
<dfl_node.peering.port.PeerLink.call>`, :meth:`PeerHandler.control <dfl_node.peering.port.PeerHandler.control>`):
the simulator hands the object over, gRPC its kind and fields (:mod:`dfl_node.net.envelopes`). Nothing else changes
to add one (``docs/control-messages.md``). Both ends must register the kind; a node that does not know it refuses it
(``unknown_control``). Registration happens as the defining module is imported, once per process: a kind (or a type)
registered twice is refused, as two meanings of one name would be.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dfl_node.peering.errors import TransferRejected

M = TypeVar("M")
C = TypeVar("C", bound=type)
Handler = Callable[[Any, M], Awaitable[Any]]  # (the node's PeerHandler, the message) -> the kind's reply

KIND = re.compile(r"[a-z][a-z0-9_.-]{0,63}")  # a kind's name: short, stable, readable in a refusal's detail


@dataclass(frozen=True)
class ControlKind:
    """A registered control message: its name on the wire, its type and its reply's."""

    name: str
    message: type
    reply: type


_KINDS: dict[str, ControlKind] = {}  # kind name -> its registration
_BY_TYPE: dict[type, ControlKind] = {}  # message type -> its registration
_HANDLERS: dict[type, Handler[Any]] = {}  # message type -> what a node answers it


def _frozen_dataclass(cls: type, what: str) -> None:
    params = getattr(cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"{what} {cls.__qualname__} must be a frozen dataclass: a message that crossed to a node is "
                        "never changed there")


def control_message(kind: str, *, reply: type) -> Callable[[C], C]:
    """Register the decorated frozen dataclass as the control message ``kind``, answered with a ``reply``."""
    if not KIND.fullmatch(kind):
        raise ValueError(f"control message kind {kind!r}: lowercase letters, digits, '_', '.', '-' (at most 64), "
                         "starting with a letter")
    _frozen_dataclass(reply, "the reply of control message")

    def register(cls: C) -> C:
        _frozen_dataclass(cls, "control message")
        if kind in _KINDS:
            raise ValueError(f"control message kind {kind!r} is registered already (by "
                             f"{_KINDS[kind].message.__qualname__})")
        if cls in _BY_TYPE:
            raise ValueError(f"{cls.__qualname__} is registered already, as {_BY_TYPE[cls].name!r}")
        _KINDS[kind] = _BY_TYPE[cls] = ControlKind(kind, cls, reply)
        return cls

    return register


def handles(message: type[M]) -> Callable[[Handler[M]], Handler[M]]:
    """Register the decorated ``async def handler(node, message) -> reply`` as what a node answers ``message``
    (a registered control message; one handler each)."""
    if message not in _BY_TYPE:
        raise ValueError(f"{message.__qualname__} is no registered control message (@control_message)")

    def register(handler: Handler[M]) -> Handler[M]:
        if message in _HANDLERS:
            raise ValueError(f"{message.__qualname__} has a handler already ({_HANDLERS[message].__qualname__})")
        _HANDLERS[message] = handler
        return handler

    return register


def kind_named(name: str) -> ControlKind:
    """The control message registered as ``name``; a peer's request for a kind unknown here is refused."""
    found = _KINDS.get(name)
    if found is None:
        raise TransferRejected("unknown_control", f"no control message {name[:64]!r} here")
    return found


def kind_of(message: object) -> ControlKind:
    """The registration of ``message``'s type (sending an unregistered one is our own mistake: TypeError)."""
    found = _BY_TYPE.get(type(message))
    if found is None:
        raise TypeError(f"{type(message).__qualname__} is no registered control message (@control_message)")
    return found


async def answer(node: object, message: object) -> object:
    """What ``node`` answers a peer's control ``message``: its handler's reply. Refused (``unknown_control``) where
    no handler is registered for it here; a handler refuses by raising
    :class:`~dfl_node.peering.errors.TransferRejected`."""
    kind = kind_of(message)
    handler = _HANDLERS.get(kind.message)
    if handler is None:
        raise TransferRejected("unknown_control", f"{kind.name!r} is not answered here")
    reply = await handler(node, message)
    if type(reply) is not kind.reply:
        raise TypeError(f"the handler of {kind.name!r} answered a {type(reply).__qualname__}, not its "
                        f"{kind.reply.__qualname__}")
    return reply
