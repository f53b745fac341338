"""A node's transport, the round runner's :class:`~dfl_node.algorithms.runner.Transport`: algorithm calls in a
worker thread, messages over the peer network port (:mod:`dfl_node.peering`: gRPC in a daemon, memory in the
simulator).

One :class:`PeerTransport` serves one role of one node: a sender's push goes to its aggregator's address and
reports the aggregator's verdict as soon as it comes (``accepted``), before any reply, but completes only when the
aggregator confirms that its fusion is durable (the reply, or the end of the stream); an aggregator gathers from
its :class:`Collector` (pushed messages) or pulls from its sources, and hands the replies back to the senders'
open streams. The sender of an open group (001's client selection) probes its candidates — one that does not
answer within ``probe_timeout`` is skipped and counted — and binds the one its algorithm chose by giving it the
aggregator role itself, with the epoch and holder of its own order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from dfl_node.algorithms import AlgorithmError
from dfl_node.algorithms.defences import Refusal
from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.plan import Role, Step
from dfl_node.algorithms.selection import Probe, ProbeAnswer, SelectionError, check_answer
from dfl_node.algorithms.step_guard import DIVERGED
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.arrival_checks import check_finite, check_received
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.exchange.collector import Collector
from dfl_node.node.exchange.link_quality import LinkQuality
from dfl_node.node.model.learner import Learner
from dfl_node.peering.errors import PeerUnreachable, TransferCut, TransferRefused, TransferRejected
from dfl_node.peering.messages import Ack, PullRequest
from dfl_node.peering.port import PeerNetwork
from dfl_node.peering.probes import ProbeRequest, answer_from_reply, probe_request
from dfl_node.peering.resume import SMALL_CHUNK, Resume
from dfl_node.records.metrics import Timed
from dfl_node.settings.node import RoleSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
# The algorithm steps /metrics times, by the name of the Algorithm method the round runner computes.
_TIMED: dict[str, Timed] = {"transmit": "train", "local_step": "train", "aggregate": "fusion"}


class TransferFailed(Exception):
    """A sender's message did not reach its aggregator (refused, unreachable, timed out)."""


class AlreadyPlayed(Exception):
    """Round mode: the chosen receiver already played this round (its group fused before a crash hid the
    confirmation): the sender's round is over, without a second transfer."""


class Player(Protocol):
    """What a role's transport uses of the roles part that plays it (:class:`~dfl_node.node.exchange.roles.Roles`)."""

    node_id: str
    swarm: str
    clock: Clock
    settings: RoleSettings
    round_timeout: float
    learner: Learner
    tally: Tally
    network: PeerNetwork
    links: LinkQuality

    def address_in(self, node_id: str, order: Assignment) -> str | None: ...
    def deadline_of(self, order: Assignment) -> float: ...
    async def dispatch(self, node_id: str, order: Assignment) -> Ack: ...
    def fusion_started(self) -> None: ...


class PeerTransport:
    """The transport of one role (``order``) of the node whose ``roles`` play it."""

    def __init__(self, roles: Player, order: Assignment, collector: Collector | None = None, *,
                 aggregator_address: str = "", accepted: asyncio.Future[bool] | None = None) -> None:
        self.roles = roles
        self.order = order  # the holder's address book; for an open group's sender, the holder and deadline a
        # chosen aggregator gets
        self.epoch = order.epoch
        self.aggregator_address = aggregator_address
        self.collector = collector
        self.accepted = accepted
        self.replies: dict[str, ModelMessage] = {}  # an aggregator's replies, until its fusion is durable
        self.computed = 0.0  # seconds this role spent in the algorithm's computations

    def address_of(self, node_id: str) -> str | None:
        return self.roles.address_in(node_id, self.order)

    async def compute(self, fn: Callable[..., T], *args: object) -> T:
        """``fn`` in a worker thread; the algorithm's training and fusion steps are timed (``/metrics``)."""
        clock = self.roles.clock
        started = clock.monotonic()
        result = await asyncio.to_thread(fn, *args)
        took = clock.monotonic() - started
        self.computed += took
        timed = _TIMED.get(getattr(fn, "__name__", ""))
        if timed is not None:
            self.roles.tally.observe(timed, took)
        return result

    def verdict(self, ok: bool) -> None:
        """A sender's transfer was taken (or, once its role ends, was not): what an inviting volunteer waits for."""
        if self.accepted is not None and not self.accepted.done():
            self.accepted.set_result(ok)

    @property
    def timeout(self) -> float:
        """How long a transfer of this role may take, its retries and its aggregator's fusion included."""
        return self.roles.deadline_of(self.order)

    async def push(self, step: Step, message: ModelMessage) -> ModelMessage | None:
        roles, tally = self.roles, self.roles.tally
        aggregator = step.group.aggregator
        started = roles.clock.monotonic()
        took: list[float] = []  # until the aggregator held the whole message (then it fuses, and replies)

        def accepted() -> None:
            if not took:  # a resumed transfer may be accepted (confirmed) once more
                took.append(roles.clock.monotonic() - started)
            self.verdict(True)

        # where the aggregator serves as our membership knows it now, else as the holder knew it when it planned: a
        # relayed aggregator whose relay died since is at its new slot (it announced the move), not at the old one
        link = roles.network.link(self.address_of(aggregator) or self.aggregator_address)
        resume = Resume(chunk_bytes=roles.links.chunk_for(aggregator))
        lost = False  # the link lost it (a refusal is not the link's)
        try:
            reply, _, _ = await self._resumed(aggregator, resume, lambda left: link.push(
                message, self.epoch, timeout=left, on_accepted=accepted, resume=resume))
        except (TransferRefused, PeerUnreachable) as exc:
            lost = isinstance(exc, PeerUnreachable)
            self.verdict(False)
            raise TransferFailed(f"{aggregator} did not take it: {exc.reason}") from exc
        finally:
            tally.transferred("sent", resume.sent, took[0] if took else None)
            tally.transferred("received", resume.received)
            tally.count("bytes_resent", resume.resent)
            if took or lost:
                roles.links.transferred(aggregator, "sent", resume.size, took[0] if took else 0.0,
                                        resent=resume.resent, ok=bool(took))
        tally.count("models_sent")
        if reply is not None:
            try:
                await asyncio.to_thread(check_finite, reply)  # a poisoned reply never reaches our model
            except TransferRejected as exc:
                tally.reject(exc.reason, exc.detail, aggregator)
                raise TransferFailed(f"{aggregator}'s reply was refused: {exc.reason}") from exc
        return on_device(reply, roles.learner.device) if reply is not None else None

    async def _resumed(self, peer: str, resume: Resume, attempt: Callable[[float], Awaitable[T]]) -> T:
        """``attempt(timeout)`` — one try of a model stream with ``peer``, over ``resume`` — and after each cut again,
        going on from what the receiving end holds (:mod:`dfl_node.peering.resume`): while that end took more within
        the last ``resume_window`` seconds and the role's deadline allows. A peer that died cannot be reached within
        ``connect_timeout``, and one that restarted holds nothing and refuses: either ends the retries. The cut link
        streams small chunks from then on (a chunk crosses whole or not at all)."""
        roles, clock = self.roles, self.roles.clock
        deadline = clock.monotonic() + self.timeout
        window = roles.settings.resume_window
        progress, progressed_at, stalls = -1, clock.monotonic(), 0
        while True:
            try:
                return await attempt(max(0.0, deadline - clock.monotonic()))
            except TransferCut as exc:
                roles.tally.count("transfers_cut")
                roles.links.cut(peer)
                now = clock.monotonic()
                if resume.progress > progress:
                    progress, progressed_at, stalls = resume.progress, now, 0
                else:
                    stalls += 1
                if window <= 0 or now - progressed_at > window or now >= deadline:
                    raise  # stalled, or out of time (a peer that died or restarted refuses the next attempt)
                resume.chunk_bytes = resume.chunk_bytes or SMALL_CHUNK
                log.info("%s: the transfer with %s was cut (%s); resuming from what it holds", roles.node_id, peer,
                         exc.detail)
                await asyncio.sleep(min(2.0, 0.25 * 2**stalls))

    async def gather(self, step: Step) -> list[ModelMessage]:
        assert self.collector is not None
        if step.group.pull:
            messages = [m for m in await asyncio.gather(*(self._pull(step, s) for s in step.group.senders)) if m]
            self.collector.gathered.set()
        else:
            messages = await self.collector.wait()
        missing = len(step.group.senders) - len(messages)
        if missing:
            self.roles.tally.count("senders_abandoned", missing)
            log.warning("%s: round %d aggregates %d of %d messages (%s left out)", self.roles.node_id, step.round + 1,
                        len(messages), len(step.group.senders), ", ".join(sorted(set(step.group.senders) -
                                                                                  {m.sender for m in messages})))
        if messages:
            self.roles.fusion_started()
        return messages

    async def _pull(self, step: Step, source: str) -> ModelMessage | None:
        roles, learner, tally = self.roles, self.roles.learner, self.roles.tally
        request = PullRequest(aggregator=roles.node_id, swarm=roles.swarm, round=step.round, epoch=self.epoch,
                              state=dict(step.state))
        resume = Resume(chunk_bytes=roles.links.chunk_for(source))
        arrived, lost = False, False  # whole, or lost by the link (a refusal is not the link's)
        try:
            address = self.address_of(source)
            if address is None:
                raise TransferRefused("unreachable", "not in the peer table nor in the assignment")
            link = roles.network.link(address)
            message, _ = await self._resumed(source, resume, lambda left: link.pull(request, timeout=left,
                                                                                  resume=resume))
            arrived = True
            message = on_device(message, learner.device)
            learner.algorithm.check_message(learner.ctx, message)
            await asyncio.to_thread(check_received, learner.ctx, message, roles.settings.min_accuracy)
        except TransferRejected as exc:  # well-formed, but poisoned or too poor: counted like a refused push
            tally.reject(exc.reason, exc.detail, source)
            return None
        except (TransferRefused, PeerUnreachable, AlgorithmError) as exc:
            lost = isinstance(exc, PeerUnreachable)
            log.warning("%s: pulling from %s failed: %s", roles.node_id, source, exc)
            return None
        finally:  # not timed: the call's time is mostly the source's training
            tally.transferred("received", resume.received)
            if arrived or lost:
                roles.links.transferred(source, "received", resume.received, 0.0, ok=arrived)
        tally.count("models_received")
        return message

    async def reply(self, step: Step, replies: Mapping[str, ModelMessage]) -> None:
        """Keep the replies: the node hands them out once its fusion is checkpointed (the senders' confirmation)."""
        self.replies = dict(replies)

    def refuse(self, refusal: Refusal) -> None:
        """A defence refused (or bounded) a message of this role: counted by its reason; a sender whose model
        was dropped learns it now."""
        self.roles.tally.reject(refusal.reason, refusal.detail, refusal.sender)
        if not refusal.kept and self.collector is not None:
            self.collector.refuse(refusal.sender, TransferRejected(refusal.reason, refusal.detail))

    def diverged(self, detail: str) -> None:
        """This node's own training went non-finite and was undone: nobody to blame; counted (``diverged``) and
        said at WARNING, rate-limited as refusals are."""
        self.roles.tally.refused(DIVERGED)
        self.roles.tally.warn(DIVERGED, "%s: %s", self.roles.node_id, detail)

    async def restore(self) -> None:
        """The models back as the role found them: the newest checkpoint, which every role starts from."""
        await self.roles.learner.restore_durable()

    async def probe(self, step: Step, probe: Probe) -> dict[str, ProbeAnswer]:
        request = probe_request(probe, swarm=self.roles.swarm, epoch=self.epoch)
        candidates = step.group.candidates
        answers = await asyncio.gather(*(self._probe(c, request, probe) for c in candidates))
        return {c: a for c, a in zip(candidates, answers) if a is not None}

    async def _probe(self, candidate: str, request: ProbeRequest, probe: Probe) -> ProbeAnswer | None:
        """One candidate's answer, or None (skipped, counted) if it is unknown, silent, refuses or talks nonsense."""
        roles, tally = self.roles, self.roles.tally
        tally.count("probes_sent")
        address = self.address_of(candidate)
        try:
            if address is None:
                raise TransferRefused("unreachable", "not in the peer table")
            reply = await roles.network.link(address).probe(request, timeout=roles.settings.probe_timeout)
            if not reply.ok:
                raise TransferRefused(reply.reason or "refused")
            answer = answer_from_reply(reply, candidate)
            check_answer(answer, probe, roles.learner.ctx.train.num_classes)
        except (TransferRefused, PeerUnreachable, SelectionError) as exc:
            tally.count("probes_unanswered")
            if isinstance(exc, SelectionError):
                tally.refused("bad_probe_answer")
            why = exc.reason if isinstance(exc, PeerUnreachable) else str(exc)
            log.warning("%s: round %d: candidate %s skipped: %s", roles.node_id, request.round + 1, candidate, why)
            return None
        return answer

    async def bind(self, step: Step) -> bool:
        """Make the chosen candidate the group's aggregator (as a holder would), then push to it."""
        roles, mine = self.roles, self.order
        chosen = step.group.aggregator
        address = self.address_of(chosen) or ""
        role = Assignment(Role.AGGREGATOR, Step(step.round, step.group, dict(step.state)), self.epoch, mine.holder,
                     address, roles.deadline_of(mine), mine.addresses)
        ack = await roles.dispatch(chosen, role)
        if ack.reason == "already_played":
            raise AlreadyPlayed(f"{chosen} already played round {step.round}")
        if not ack.ok:
            log.warning("%s: round %d: chosen receiver %s refused: %s", roles.node_id, step.round + 1, chosen,
                        ack.reason)
            return False
        self.aggregator_address = address
        return True
