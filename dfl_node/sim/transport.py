"""The simulator's transport: messages handed from node to node in memory, traffic counted as the daemon counts it.

A push lands in its aggregator's inbox and waits for the reply addressed to its sender; an
aggregator's ``gather`` waits until every sender of its group has pushed (nobody dies in a
simulation) or, for a pull group, asks each source for its message directly. A selecting sender's
probe is answered by each candidate's own algorithm call, and ``bind`` starts the chosen
aggregator's coroutine (:attr:`InMemoryTransport.started`, which the simulator awaits). Algorithm
calls run inline: the asyncio interleaving only orders independent nodes, and every random draw is
keyed by (seed, round, node, purpose), so the order of play never changes a model.

With a lossy ``wire_dtype`` every model crosses as the gRPC codec would deliver it
(:func:`~dfl_node.peering.wire_dtypes.through`), and is counted at its encoded size.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import TypeVar

from dfl_node.algorithms.base import Algorithm, NodeContext
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.algorithms.plan import Step
from dfl_node.algorithms.runner import play_aggregator
from dfl_node.algorithms.selection import Probe, ProbeAnswer, SelectsReceiver
from dfl_node.peering.wire_dtypes import EXACT, payload_bytes, through

T = TypeVar("T")


class InMemoryTransport:
    def __init__(self, algorithm: Algorithm, nodes: Mapping[str, NodeContext], wire_dtype: str = EXACT) -> None:
        self.algorithm = algorithm
        self.nodes = nodes
        self.wire_dtype = wire_dtype
        self.inboxes: dict[str, list[ModelMessage]] = defaultdict(list)
        self.arrived: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.replies: dict[str, asyncio.Future[ModelMessage | None]] = {}
        self.sent: Counter[str] = Counter({node_id: 0 for node_id in nodes})
        self.received: Counter[str] = Counter({node_id: 0 for node_id in nodes})
        self.bytes_transmitted = 0
        self.models_transmitted = 0
        self.started: list[asyncio.Task[int]] = []  # aggregators of open groups, started by their senders' bind

    async def compute(self, fn: Callable[..., T], *args: object) -> T:
        return fn(*args)

    def _count(self, message: ModelMessage, to: str) -> None:
        self.sent[message.sender] += 1
        self.received[to] += 1
        self.bytes_transmitted += payload_bytes(message, self.wire_dtype)
        self.models_transmitted += 1

    def _cross(self, message: ModelMessage) -> ModelMessage:
        """``message`` as its receiver gets it: itself on an exact wire (the receiver fuses it, never changes it)."""
        return through(message, self.wire_dtype)

    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None:
        aggregator = step.group.aggregator
        reply = self.replies[message.sender] = asyncio.get_running_loop().create_future()
        self._count(message, aggregator)
        self.inboxes[aggregator].append(self._cross(message))
        if len(self.inboxes[aggregator]) == len(step.group.senders):
            self.arrived[aggregator].set()
        return await reply

    async def gather(self, step: Step) -> list[ModelMessage]:
        aggregator = step.group.aggregator
        if step.group.pull:
            messages = [self.algorithm.transmit(self.nodes[source], step) for source in step.group.senders]
            for message in messages:
                self._count(message, aggregator)
            return [self._cross(m) for m in messages]
        await self.arrived[aggregator].wait()
        del self.arrived[aggregator]
        return self.inboxes.pop(aggregator)

    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None:
        if step.group.pull:
            return
        for sender in step.group.senders:
            reply = replies.get(sender)
            if reply is not None:
                self.bytes_transmitted += payload_bytes(reply, self.wire_dtype)
                reply = self._cross(reply)
            self.replies.pop(sender).set_result(reply)

    async def probe(self, step: Step, probe: Probe) -> dict[str, ProbeAnswer]:
        assert isinstance(self.algorithm, SelectsReceiver)
        return {c: self.algorithm.answer(self.nodes[c], probe) for c in step.group.candidates}

    async def bind(self, step: Step) -> bool:
        node = self.nodes[step.group.aggregator]
        self.started.append(asyncio.get_running_loop().create_task(play_aggregator(self.algorithm, node, step, self)))
        return True
