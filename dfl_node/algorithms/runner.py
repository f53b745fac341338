"""The round sequence, written once: local steps → transmissions → aggregate → replies.

The simulator and the daemon both play a group's roles with these coroutines; only the
:class:`Transport` differs (in memory, or gRPC streams). What a transport must guarantee is small:
``push`` delivers a sender's message to its group's aggregator and returns the reply addressed to
that sender (None if the algorithm sends none); ``gather`` returns the messages that reached the
aggregator (pushed to it, or pulled by it from the group's sources); ``reply`` hands each sender
its answer. ``compute`` runs the CPU-heavy algorithm calls (inline, or in a worker thread).
Messages are sorted by sender before ``aggregate``, so arrival order never changes a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from dfl_node.algorithms.base import Algorithm, NodeContext
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step

T = TypeVar("T")


class Transport(Protocol):
    async def compute(self, fn: Callable[..., T], *args: object) -> T: ...
    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None: ...
    async def gather(self, step: Step) -> list[ModelMessage]: ...
    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None: ...


async def play_sender(algorithm: Algorithm, ctx: NodeContext, step: Step, transport: Transport) -> None:
    """Train and transmit to the group's aggregator, then use its reply."""
    message = await transport.compute(algorithm.transmit, ctx, step)
    reply = await transport.push(step, message)
    await transport.compute(algorithm.finish, ctx, step, reply)


async def play_aggregator(algorithm: Algorithm, ctx: NodeContext, step: Step, transport: Transport) -> int:
    """Own local step, then fuse every message that arrived and answer their senders; returns how many."""
    await transport.compute(algorithm.local_step, ctx, step)
    messages = sorted(await transport.gather(step), key=lambda m: m.sender)
    replies = await transport.compute(algorithm.aggregate, ctx, step, messages) if messages else {}
    await transport.reply(step, replies)
    return len(messages)
