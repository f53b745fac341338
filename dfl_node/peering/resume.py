"""A model transfer over a link that may break: what one transfer keeps across its attempts.

A gRPC message arrives whole or not at all, so a stream that is cut leaves its receiving end the chunks that arrived
before the cut. That end keeps them — an aggregator's collector for a push (:mod:`dfl_node.node.exchange.collector`),
the link itself for a pull or a reply — and the next attempt carries only the rest: over gRPC, bytes verified in order
under the payload's digest (:mod:`dfl_node.net.assembler`); in the simulator, the same counts of virtual bytes
(:mod:`dfl_node.sim.endpoints`). The node's transport makes one :class:`Resume` per message and tries again after each
cut for as long as the receiving end keeps making progress (:mod:`dfl_node.node.exchange.transport`), on either network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHUNK = 1 << 20  # a chunk of a model stream (design §3: about 1 MiB)
SMALL_CHUNK = 64 << 10  # a chunk over a link that was cut: 0.65 s at 100 kB/s, so a link that stays up a second
# still carries one (a 1 MiB chunk takes 10 s there, and a link that drops every 5 s would never carry it)
MIN_CHUNK = 16 << 10  # the smallest chunk a peer may ask for: smaller would cost more in frames than it saves


@dataclass
class Resume:
    """One message's transfer between this node and one peer, across its attempts: the node's transport makes it and
    tries again after a cut; the network fills it in."""

    chunk_bytes: int = 0  # the largest chunk the stream carries, both ways (0: the network's own, 1 MiB)
    attempts: int = 0  # attempts begun
    offset: int = 0  # payload bytes the receiving end holds, as of the newest attempt (a push: its ResumeAt)
    size: int = 0  # bytes one whole stream of the payload takes (header and payload): those sent beyond, sent again
    sent: int = 0  # bytes written over all attempts (payloads and headers): what the link carried this way
    received: int = 0  # bytes read over all attempts (a reply, a pulled model)
    wrote: int = 0  # bytes the newest push attempt wrote (as :meth:`landed` corrects them)
    prepared: Any = None  # the network's encoding of the message, made once for every attempt (gRPC: its digest)
    held: Any = None  # a pull or a reply: what arrived of the peer's payload before a cut (the network's own)

    @property
    def progress(self) -> int:
        """How far the transfer got: what the receiving end holds of a push, plus what arrived of a reply or a pull.
        A transfer that stops making progress stops being resumed."""
        return self.offset + self.received

    @property
    def resent(self) -> int:
        """Bytes sent again because a stream was cut: those sent beyond one whole stream."""
        return max(0, self.sent - self.size) if self.attempts > 1 else 0

    def landed(self, offset: int, chunk: int) -> None:
        """A resumed push's receiver holds ``offset`` payload bytes: what the attempt before carried (``offset`` less
        where it began) and, lost to its cut, at most the chunk under way (of ``chunk`` bytes). What else it wrote
        never left this machine (flow control and the socket's buffers held it): it is not counted as sent. The
        newest attempt begins there."""
        carried = offset - self.offset
        self.sent -= max(0, self.wrote - carried - chunk)
        self.offset, self.wrote = offset, 0

    @property
    def resuming(self) -> bool:
        """Whether the attempt under way goes on from an earlier one (asked by the network once it began it)."""
        return self.attempts > 1


def chunk_size(asked: int, default: int) -> int:
    """The chunk a stream carries when its receiver asked for ``asked`` bytes at most (0: ``default``)."""
    return default if asked <= 0 else max(MIN_CHUNK, min(asked, default))
