"""What a peer-port message other than a model would take on the wire, for the simulator's membership figures
(:class:`Traffic`); a model's is :func:`~dfl_node.sim.payloads.wire_size`.

A thousand nodes size tens of millions of values a virtual minute (a push-pull carries a whole view), so the common
types are told apart by their exact type before anything else, and the size of a Hello, a reply to one or a
membership update is remembered (frozen, it never changes): a node's Hello and its acceptance are each one object while
it stands where it stood, every node gossips a member's Hello, and each update a node passes on is one object. Other
messages (a ping, an ack) are built for one call and sized once, so they are not remembered, lest they push out what
is shared. The memory is bounded (100,000 sizes): the updates of the
push-pulls, each node's own of each member (a million in a fleet of a thousand), come and go, and what is gossiped
again is sized again once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass

from dfl_node.peering.messages import Hello, HelloReply, MemberUpdate

_SIZES: dict[int, tuple[object, int]] = {}  # id -> (message, its size)
_SIZES_KEPT = 100_000
_FIELDS: dict[type, tuple[str, ...]] = {}  # a message class -> its fields' names


def _size(value: object) -> int:
    """One value's bytes (see :func:`message_size`)."""
    kind = type(value)
    if kind is str or kind is bytes:
        return 2 + len(value) if value else 0  # type: ignore[arg-type]
    if kind is int:
        return 1 + max(1, (value.bit_length() + 6) // 7) if value else 0  # type: ignore[attr-defined]
    if kind is bool:
        return 2 if value else 0
    if kind is float:
        return 9 if value else 0
    if kind is tuple or kind is list:
        return sum(map(_size, value))  # type: ignore[call-overload]
    if kind is MemberUpdate or kind is Hello or kind is HelloReply:
        known = _SIZES.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        size = _update_size(value) if kind is MemberUpdate else 2 + _fields_size(value)  # type: ignore[arg-type]
        return _remember(value, size)
    if kind in _FIELDS:  # a message of a kind sized before (a ping, an ack)
        return 2 + _fields_size(value)
    return _other(value)


def _remember(message: object, size: int) -> int:
    if len(_SIZES) >= _SIZES_KEPT:
        _SIZES.clear()
    _SIZES[id(message)] = (message, size)
    return size


def _other(value: object) -> int:
    """What :func:`_size` did not tell by its exact type: a subclass of those, a mapping, a nested message."""
    if isinstance(value, str | bytes):
        return 2 + len(value) if value else 0
    if isinstance(value, bool):
        return 2 if value else 0
    if isinstance(value, int):
        return 1 + max(1, (value.bit_length() + 6) // 7) if value else 0
    if isinstance(value, float):
        return 9 if value else 0
    if isinstance(value, tuple | list):
        return sum(map(_size, value))
    if isinstance(value, Mapping):
        return sum(2 + _size(k) + _size(v) for k, v in value.items())
    if is_dataclass(value) and not isinstance(value, type):
        return 2 + _fields_size(value)
    return 0


def _update_size(update: MemberUpdate) -> int:
    """A membership update's bytes, its fields written out: sized millions of times (see the module's docstring);
    ``tests/test_swim.py`` checks it against the field-by-field rule."""
    return (2 + _size(update.state) + _size(update.incarnation) + _size(update.node_id) + _size(update.sender)
            + _size(update.hello))


def _fields_size(message: object) -> int:
    """A message's fields' bytes."""
    names = _FIELDS.get(type(message))
    if names is None:
        names = _FIELDS[type(message)] = tuple(f.name for f in fields(message))  # type: ignore[arg-type]
    return sum(_size(getattr(message, name)) for name in names)


def message_size(message: object) -> int:
    """About what a peer-port message takes as protobuf: each field's tag and value (strings and bytes their
    length, numbers a varint's or a double's 8 bytes), nested messages and repeated fields field by field, and a
    frame's 10 bytes."""
    return 10 + _size(message)


@dataclass
class Traffic:
    """The membership messages of the calls one node made, either way, and their estimated bytes."""

    messages: int = 0
    bytes: int = 0

    def count(self, message: object) -> None:
        self.messages += 1
        self.bytes += message_size(message)
