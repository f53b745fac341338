"""What a peer-port message other than a model would take on the wire, for the simulator's membership figures
(:class:`Traffic`); a model's is :func:`~dfl_node.sim.network.wire_size`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass

_SIZES: dict[int, tuple[object, int]] = {}  # id -> (message, its size): a member's Hello rides many messages
_SIZES_KEPT = 100_000
_FIELDS: dict[type, tuple[str, ...]] = {}  # a message class -> its fields' names


def _size(value: object) -> int:
    """One value's bytes (see :func:`message_size`). Sized a million times a virtual minute in a large fleet, so a
    remembered message is looked up before anything else is asked of it."""
    known = _SIZES.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
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
        inner = 2 + _fields_size(value)
        if len(_SIZES) >= _SIZES_KEPT:
            _SIZES.clear()
        _SIZES[id(value)] = (value, inner)
        return inner
    return 0


def _fields_size(message: object) -> int:
    """A message's fields' bytes (not remembered: a ping or an ack is sized once, and remembering each would push
    out the updates and Hellos that a thousand nodes size again and again)."""
    names = _FIELDS.get(type(message))
    if names is None:
        names = _FIELDS[type(message)] = tuple(f.name for f in fields(message))  # type: ignore[arg-type]
    return sum(_size(getattr(message, name)) for name in names)


def message_size(message: object) -> int:
    """About what a peer-port message takes as protobuf: each field's tag and value (strings and bytes their
    length, numbers a varint's or a double's 8 bytes), nested messages and repeated fields field by field, and a
    frame's 10 bytes. A nested message's size is remembered (frozen: it never changes), as a thousand nodes gossip
    the same updates and Hellos."""
    if is_dataclass(message) and not isinstance(message, type):
        return 10 + 2 + _fields_size(message)
    return 10 + _size(message)


@dataclass
class Traffic:
    """The membership messages of the calls one node made, either way, and their estimated bytes."""

    messages: int = 0
    bytes: int = 0

    def count(self, message: object) -> None:
        self.messages += 1
        self.bytes += message_size(message)
