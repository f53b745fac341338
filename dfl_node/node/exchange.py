"""The daemon's transport for the round runner: algorithm calls in a worker thread, messages over gRPC.

One :class:`GrpcTransport` serves one role of one node (:mod:`dfl_node.algorithms.runner`): a
sender's push goes to its aggregator's address and reports the aggregator's verdict as soon as it
comes (``accepted``), before any reply; an aggregator gathers from its :class:`Collector` (pushed
messages) or pulls from its sources, and hands the replies back to the senders' open streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import grpc

from dfl_node.algorithms import AlgorithmError
from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.plan import Step
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.transport import TransferRefused
from dfl_node.node.collector import Collector

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)
T = TypeVar("T")


class TransferFailed(Exception):
    """A sender's message did not reach its aggregator (refused, unreachable, timed out)."""


class GrpcTransport:
    def __init__(self, node: Node, epoch: int, *, aggregator_address: str = "", collector: Collector | None = None,
                 accepted: asyncio.Future[bool] | None = None) -> None:
        self.node = node
        self.epoch = epoch
        self.aggregator_address = aggregator_address
        self.collector = collector
        self.accepted = accepted

    async def compute(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.to_thread(fn, *args)

    def _verdict(self, ok: bool) -> None:
        if self.accepted is not None and not self.accepted.done():
            self.accepted.set_result(ok)

    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None:
        node = self.node
        outgoing = await asyncio.to_thread(node.wire.prepare, message, self.epoch)
        try:
            reply, sent, received = await node.client(self.aggregator_address).push(
                outgoing, timeout=node.config.round_timeout, on_accepted=lambda: self._verdict(True))
        except (TransferRefused, grpc.aio.AioRpcError) as exc:
            self._verdict(False)
            reason = exc.reason if isinstance(exc, TransferRefused) else exc.code().name
            raise TransferFailed(f"{step.group.aggregator} did not take it: {reason}") from exc
        node.state.counters.update(models_sent=1, bytes_sent=sent, bytes_received=received)
        return on_device(reply, node.device) if reply is not None else None

    async def gather(self, step: Step) -> list[ModelMessage]:
        assert self.collector is not None
        if step.group.pull:
            messages = [m for m in await asyncio.gather(*(self._pull(step, s) for s in step.group.senders)) if m]
            self.collector.gathered.set()
        else:
            messages = await self.collector.wait()
        missing = len(step.group.senders) - len(messages)
        if missing:
            self.node.state.counters["senders_abandoned"] += missing
            log.warning("%s: round %d aggregates %d of %d messages (%s left out)", self.node.config.id, step.round,
                        len(messages), len(step.group.senders), ", ".join(sorted(set(step.group.senders) -
                                                                                  {m.sender for m in messages})))
        if messages:
            self.node.fusion_started()
        return messages

    async def _pull(self, step: Step, source: str) -> ModelMessage | None:
        node = self.node
        request = pb.PullRequest(aggregator=node.config.id, swarm=node.config.swarm, round=step.round,
                                 epoch=self.epoch, state=dict(step.state))
        try:
            message, received = await node.client(node.address_of(source) or "").pull(
                request, timeout=node.config.round_timeout)
            message = on_device(message, node.device)
            node.algorithm.check_message(node.ctx, message)
        except (TransferRefused, grpc.aio.AioRpcError, AlgorithmError) as exc:
            log.warning("%s: pulling from %s failed: %s", node.config.id, source, exc)
            return None
        node.state.counters.update(models_received=1, bytes_received=received)
        return message

    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None:
        assert self.collector is not None
        self.collector.answer(replies)
