"""An aggregator's inbox for one group: whom it expects, what arrived (under a memory bound), and the replies.

An aggregator accepts a transfer only from a sender its group names, for that round and epoch, once
(others are refused: ``not_expected``, ``duplicate``). Before a payload is received its declared size
is reserved against ``max_bytes``, so N concurrent senders can never hold more than the bound.
:meth:`Collector.wait` returns when every expected sender delivered, or at the deadline with those
that did — a sender that died mid-stream is left out (and counted by the node). Replies are futures
the Transfer RPCs of the senders wait on, so each reply goes back on its sender's own stream; they
resolve only once the fusion is checkpointed, so the end of a sender's stream confirms a durable fusion.

A transfer cut mid-stream is not a sender lost: what arrived of it is kept (:meth:`Collector.interrupt`, its memory
still reserved) for ``resume_window`` seconds, and the group waits for the sender to resume it
(:mod:`dfl_node.peering.resume`); a resumed transfer of a message that had arrived whole is answered with that
message's confirmation (:meth:`Collector.admit`), also once the group is over, for as long as the node keeps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.heap import trim_heap
from dfl_node.node.core.clock import Clock
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import Offer


@dataclass(frozen=True)
class Partial:
    """What arrived of a transfer that was cut: kept for its sender to resume until ``until`` (the node's clock)."""

    key: bytes  # what identifies the payload (Offer.digest): a resumed transfer must name the same
    held: object  # what the network kept of it (over gRPC, its assembler)
    size: int  # the bytes reserved for it
    until: float


@dataclass(frozen=True)
class Admitted:
    """A transfer the collector takes: what it holds of it already (a resumed one), or the confirmation of a
    message that had arrived whole (a resumed one, cut while its sender waited for that confirmation)."""

    held: object | None = None
    arrived: asyncio.Future[ModelMessage | None] | None = None


class Collector:
    def __init__(self, step: Step, epoch: int, clock: Clock, *, deadline_s: float, max_bytes: int,
                 expected: Iterable[str] | None = None, assigned_by: str = "", resume_window: float = 0.0) -> None:
        self.step = step
        self.assigned_by = assigned_by  # the holder whose Assign this group waits on ("": our own, async mode)
        self.epoch = epoch
        self.clock = clock
        self.deadline = clock.monotonic() + deadline_s
        self.max_bytes = max_bytes
        self.expected = set(step.group.senders if expected is None else expected)
        self.messages: dict[str, ModelMessage] = {}
        self.receiving: dict[str, int] = {}  # sender -> bytes reserved for a transfer in progress
        self.resume_window = resume_window  # how long what arrived of a cut transfer is kept (0: not kept)
        self.partials: dict[str, Partial] = {}  # sender -> what arrived of its transfer before a cut
        self.keys: dict[str, bytes] = {}  # sender -> what identifies the message it delivered (Offer.digest)
        self.replies: dict[str, asyncio.Future[ModelMessage | None]] = {}
        self._changed = asyncio.Event()
        self.gathered = asyncio.Event()  # set once wait() returned: the group's transfers are over

    @property
    def round(self) -> int:
        return self.step.round

    def settle_on(self, step: Step) -> None:
        """An async volunteer's group, once it knows which of the invited came (``step``'s senders)."""
        self.step = step

    def matches(self, offer: Offer) -> bool:
        return offer.round == self.round and offer.epoch == self.epoch

    def admit(self, offer: Offer) -> Admitted:
        """Reserve room for ``offer``'s payload, or refuse it with a reason. A resumed transfer gets what is held of
        it, or the confirmation of its message if that had arrived whole."""
        sender = offer.sender
        if offer.resume and sender in self.keys and self.keys[sender] == offer.digest:
            return Admitted(arrived=self.replies[sender])
        partial = self.partials.pop(sender, None)  # a fresh transfer replaces what was kept of an older one
        if self.gathered.is_set():
            raise TransferRejected("too_late", f"round {self.round}'s aggregation already began")
        if sender not in self.expected:
            raise TransferRejected("not_expected", f"{sender!r} is not a sender of round {self.round} here")
        if sender in self.messages or sender in self.receiving:
            raise TransferRejected("duplicate", f"{sender!r} already sent its round {self.round} model")
        if self.reserved + offer.total_size > self.max_bytes:
            raise TransferRejected("over_memory", f"{offer.total_size} bytes over the aggregator's bound of "
                                                  f"{self.max_bytes} ({self.reserved} reserved)")
        self.receiving[sender] = offer.total_size
        resumed = partial is not None and offer.resume and partial.key == offer.digest
        return Admitted(held=partial.held if resumed and partial is not None else None)

    def interrupt(self, sender: str, key: bytes, held: object) -> None:
        """``sender``'s transfer was cut after :meth:`admit`: ``held`` (what arrived) is kept, its memory still
        reserved, for ``resume_window`` seconds; the group goes on waiting for the sender meanwhile."""
        size = self.receiving.pop(sender, 0)
        if self.gathered.is_set() or self.resume_window <= 0:
            self.withdraw(sender)
            return
        self.partials[sender] = Partial(key, held, size, self.clock.monotonic() + self.resume_window)
        self._changed.set()

    @property
    def reserved(self) -> int:
        return (sum(self.receiving.values()) + sum(p.size for p in self.partials.values())
                + sum(m.nbytes for m in self.messages.values()))

    def deliver(self, message: ModelMessage, key: bytes = b"") -> asyncio.Future[ModelMessage | None]:
        """A validated message (``key``: what identifies its payload, for a resumed transfer's confirmation);
        returns the future of its reply."""
        self.receiving.pop(message.sender, None)
        self.messages[message.sender] = message
        self.keys[message.sender] = key
        reply = self.replies[message.sender] = asyncio.get_running_loop().create_future()
        self._changed.set()
        return reply

    def abandon(self, sender: str) -> None:
        """A transfer that failed after :meth:`admit` (truncated, rejected, its sender gone): that sender
        will not send again this round, so the group no longer waits for it."""
        self.receiving.pop(sender, None)
        self.withdraw(sender)

    def withdraw(self, sender: str) -> None:
        """A sender that will not send (it refused its invitation, or will not resume what it began), or whose
        message is not wanted any more (its invitation's answer said it failed): what it sent is let go, and if it
        waits for a confirmation it learns, as the group closes, that its model was not fused."""
        self.partials.pop(sender, None)
        self.messages.pop(sender, None)
        self.expected.discard(sender)
        self._changed.set()

    def release(self, assigned: Callable[[str], bool]) -> set[str]:
        """The holder that assigned this group crashed: stop waiting for the senders that have not begun to send
        and were never ``assigned`` (its round is played again under a regenerated token). Who they were."""
        never = {sender for sender in self.missing() - self.receiving.keys() if not assigned(sender)}
        for sender in never:
            self.withdraw(sender)
        return never

    def expire(self) -> None:
        """Nothing more can arrive (the node stopped serving): :meth:`wait` returns now, as at the deadline."""
        self.deadline = self.clock.monotonic()
        self._changed.set()

    def missing(self) -> set[str]:
        return self.expected - self.messages.keys()

    async def wait(self) -> list[ModelMessage]:
        """Until every expected sender delivered, or the deadline; the messages that arrived. A sender whose cut
        transfer was not resumed within ``resume_window`` is no longer waited for."""
        now = self.clock.monotonic()
        while self.missing() and not self.gathered.is_set() and now < self.deadline:
            self._changed.clear()
            wake = min([self.deadline, *(p.until for p in self.partials.values())])
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, wake - now))
                now = self.clock.monotonic()
            except TimeoutError:  # ``wake`` came, whatever the clock reads (asyncio runs a timer that falls within
                now = max(self.clock.monotonic(), wake)  # its clock's resolution early: a loop that spun)
            for sender in [s for s, p in self.partials.items() if p.until <= now]:
                self.withdraw(sender)
        self.gathered.set()
        return list(self.messages.values())

    def answer(self, replies: Mapping[str, ModelMessage]) -> None:
        """The fusion is durable: hand each sender its reply (None where the algorithm has none for it),
        which is also its confirmation that the round is done."""
        for sender, future in self.replies.items():
            if not future.done():
                future.set_result(replies.get(sender))

    def refuse(self, sender: str, refusal: TransferRejected) -> None:
        """A defence refused ``sender``'s message once it had arrived (:mod:`dfl_node.algorithms.defences`): its
        stream ends with that refusal now, and its round is over without a fusion of its model."""
        future = self.replies.get(sender)
        if future is not None and not future.done():
            future.set_exception(refusal)
            future.exception()  # retrieved: a sender that already hung up never awaits it

    def close(self) -> None:
        """Whatever happened, the group is over: nobody waits for it any longer, and the memory its
        streams freed goes back to the kernel (:func:`~dfl_node.heap.trim_heap`). A sender not
        answered by now learns that its model was not fused (``not_fused``): its round is not done. What is
        left are the confirmations (the replies' futures), for a sender whose stream was cut while it waited."""
        self.gathered.set()
        self._changed.set()
        for future in self.replies.values():
            if not future.done():
                future.set_exception(TransferRejected("not_fused", f"round {self.round} ended without a fusion"))
                future.exception()  # retrieved: a sender that already hung up never awaits it
        self.partials.clear()
        self.messages.clear()
        trim_heap()
