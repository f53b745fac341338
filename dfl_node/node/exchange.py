"""The daemon's transport for the round runner: algorithm calls in a worker thread, messages over the
peer network port (:mod:`dfl_node.peering`; gRPC in a daemon).

One :class:`PeerTransport` serves one role of one node (:mod:`dfl_node.algorithms.runner`): a
sender's push goes to its aggregator's address and reports the aggregator's verdict as soon as it
comes (``accepted``), before any reply, but completes only when the aggregator confirms that its fusion
is durable (the reply, or the end of the stream); an aggregator gathers from its :class:`Collector` (pushed
messages) or pulls from its sources, and hands the replies back to the senders' open streams. The
sender of an open group (001's client selection) probes its candidates — one that
does not answer within ``probe_timeout`` is skipped and counted — and binds the one its algorithm
chose by assigning it the aggregator role itself, with the epoch and holder of its own assignment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from dfl_node.algorithms import AlgorithmError
from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.plan import Role, Step
from dfl_node.algorithms.selection import Probe, ProbeAnswer, SelectionError, check_answer
from dfl_node.api.metrics import Timed
from dfl_node.node.collector import Collector
from dfl_node.node.gate import check_finite, check_received
from dfl_node.peering.errors import PeerUnreachable, TransferRefused, TransferRejected
from dfl_node.peering.messages import Assignment, PullRequest
from dfl_node.peering.probes import ProbeRequest, answer_from_reply, probe_request

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)
T = TypeVar("T")
# The algorithm steps /metrics times, by the name of the Algorithm method the round runner computes.
_TIMED: dict[str, Timed] = {"transmit": "train", "local_step": "train", "aggregate": "fusion"}


class TransferFailed(Exception):
    """A sender's message did not reach its aggregator (refused, unreachable, timed out)."""


class AlreadyPlayed(Exception):
    """Round mode: the chosen receiver already played this round (its group fused before a crash hid the
    confirmation): the sender's round is over, without a second transfer."""


class PeerTransport:
    def __init__(self, node: Node, epoch: int, *, aggregator_address: str = "", collector: Collector | None = None,
                 accepted: asyncio.Future[bool] | None = None, assignment: Assignment | None = None) -> None:
        self.node = node
        self.assignment = assignment  # the role's assignment: the holder's address book; for an open group's
        # sender, the holder and deadline a chosen aggregator gets
        self.epoch = epoch
        self.aggregator_address = aggregator_address
        self.collector = collector
        self.accepted = accepted
        self.replies: dict[str, ModelMessage] = {}  # an aggregator's replies, until its fusion is durable

    def address_of(self, node_id: str) -> str | None:
        return self.node.roles.address_in(node_id, self.assignment)

    async def compute(self, fn: Callable[..., T], *args: object) -> T:
        """``fn`` in a worker thread; the algorithm's training and fusion steps are timed (``/metrics``)."""
        started = self.node.clock.monotonic()
        result = await asyncio.to_thread(fn, *args)
        timed = _TIMED.get(getattr(fn, "__name__", ""))
        if timed is not None:
            self.node.metrics.observe(timed, self.node.clock.monotonic() - started)
        return result

    def _verdict(self, ok: bool) -> None:
        if self.accepted is not None and not self.accepted.done():
            self.accepted.set_result(ok)

    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None:
        node = self.node
        started = node.clock.monotonic()
        took: list[float] = []  # until the aggregator held the whole message (then it fuses, and replies)

        def accepted() -> None:
            took.append(node.clock.monotonic() - started)
            self._verdict(True)

        try:
            reply, sent, received = await node.client(self.aggregator_address).push(
                message, self.epoch, timeout=node.config.round_timeout, on_accepted=accepted)
        except (TransferRefused, PeerUnreachable) as exc:
            self._verdict(False)
            raise TransferFailed(f"{step.group.aggregator} did not take it: {exc.reason}") from exc
        node.state.counters["models_sent"] += 1
        node.transferred("sent", sent, took[0] if took else None)
        node.transferred("received", received)
        if reply is not None:
            try:
                await asyncio.to_thread(check_finite, reply)  # a poisoned reply never reaches our model
            except TransferRejected as exc:
                node.on_rejected(exc.reason, exc.detail, step.group.aggregator)
                raise TransferFailed(f"{step.group.aggregator}'s reply was refused: {exc.reason}") from exc
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
            log.warning("%s: round %d aggregates %d of %d messages (%s left out)", self.node.config.id, step.round + 1,
                        len(messages), len(step.group.senders), ", ".join(sorted(set(step.group.senders) -
                                                                                  {m.sender for m in messages})))
        if messages:
            self.node.roles.fusion_started()
        return messages

    async def _pull(self, step: Step, source: str) -> ModelMessage | None:
        node = self.node
        request = PullRequest(aggregator=node.config.id, swarm=node.config.swarm, round=step.round,
                              epoch=self.epoch, state=dict(step.state))
        try:
            address = self.address_of(source)
            if address is None:
                raise TransferRefused("unreachable", "not in the peer table nor in the assignment")
            message, received = await node.client(address).pull(request, timeout=node.config.round_timeout)
            message = on_device(message, node.device)
            node.algorithm.check_message(node.ctx, message)
            await asyncio.to_thread(check_received, node.ctx, message, node.config.min_accuracy)
        except TransferRejected as exc:  # well-formed, but poisoned or too poor: counted like a refused push
            node.on_rejected(exc.reason, exc.detail, source)
            return None
        except (TransferRefused, PeerUnreachable, AlgorithmError) as exc:
            log.warning("%s: pulling from %s failed: %s", node.config.id, source, exc)
            return None
        node.state.counters["models_received"] += 1
        node.transferred("received", received)  # not timed: the call's time is mostly the source's training
        return message

    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None:
        """Keep the replies: the node hands them out once its fusion is checkpointed (the senders' confirmation)."""
        self.replies = dict(replies)

    async def probe(self, step: Step, probe: Probe) -> dict[str, ProbeAnswer]:
        request = probe_request(probe, swarm=self.node.config.swarm, epoch=self.epoch)
        candidates = step.group.candidates
        answers = await asyncio.gather(*(self._probe(c, request, probe) for c in candidates))
        return {c: a for c, a in zip(candidates, answers) if a is not None}

    async def _probe(self, candidate: str, request: ProbeRequest, probe: Probe) -> ProbeAnswer | None:
        """One candidate's answer, or None (skipped, counted) if it is unknown, silent, refuses or talks nonsense."""
        node = self.node
        node.state.counters["probes_sent"] += 1
        address = self.address_of(candidate)
        try:
            if address is None:
                raise TransferRefused("unreachable", "not in the peer table")
            reply = await node.client(address).probe(request, timeout=node.config.probe_timeout)
            if not reply.ok:
                raise TransferRefused(reply.reason or "refused")
            answer = answer_from_reply(reply, candidate)
            check_answer(answer, probe, node.ctx.train.num_classes)
        except (TransferRefused, PeerUnreachable, SelectionError) as exc:
            node.state.counters["probes_unanswered"] += 1
            if isinstance(exc, SelectionError):
                node.state.rejected["bad_probe_answer"] += 1
            why = exc.reason if isinstance(exc, PeerUnreachable) else str(exc)
            log.warning("%s: round %d: candidate %s skipped: %s", node.config.id, request.round + 1, candidate, why)
            return None
        return answer

    async def bind(self, step: Step) -> bool:
        """Make the chosen candidate the group's aggregator (as a holder would), then push to it."""
        node, mine = self.node, self.assignment
        assert mine is not None
        chosen = step.group.aggregator
        address = self.address_of(chosen) or ""
        role = Assignment(round=step.round, epoch=self.epoch, holder=mine.holder, role=Role.AGGREGATOR.value,
                          aggregator=chosen, aggregator_address=address, state=dict(step.state),
                          senders=step.group.senders, deadline_s=node.roles.deadline_of(mine), addresses=mine.addresses)
        ack = await node.roles.assign_to(chosen, role)
        if ack.reason == "already_played":
            raise AlreadyPlayed(f"{chosen} already played round {step.round}")
        if not ack.ok:
            log.warning("%s: round %d: chosen receiver %s refused: %s", node.config.id, step.round + 1, chosen,
                        ack.reason)
            return False
        self.aggregator_address = address
        return True

