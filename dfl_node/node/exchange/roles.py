"""The roles a node plays, one at a time (:class:`Role`): one part owns the role held, the task that plays it and
the group it aggregates (:class:`Roles`).

A sender or aggregator role runs as a task (``_settling``) through the round runner over :class:`PeerTransport`
and is held until its work is checkpointed; the next role, in round mode, waits for it (:meth:`Roles.settled`).
Serving a pull (a source) and answering a probe (a candidate) are roles too, held for as long as they take
(:mod:`.requested_roles`, which :class:`Roles` inherits); async mode's volunteering (:meth:`Roles.lead`) lives here.
A role changes the model through the algorithm; the model, its evaluation and its checkpoints are the
:class:`~dfl_node.node.model.learner.Learner`'s. A peer that leaves or restarts while a group waits for it is
:mod:`.absences`'.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from dfl_node.algorithms import Group, Role, Step
from dfl_node.algorithms.runner import SelectionFailed, play_aggregator, play_sender
from dfl_node.algorithms.step_guard import NonFinite
from dfl_node.learning.algorithm_settings import DefenceSettings
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.reports import Reporter
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.exchange.collector import Collector
from dfl_node.node.exchange.link_quality import LinkQuality
from dfl_node.node.exchange.requested_roles import RequestedRoles
from dfl_node.node.exchange.transport import AlreadyPlayed, PeerTransport, TransferFailed
from dfl_node.node.membership.membership import Members
from dfl_node.node.model.learner import Learner
from dfl_node.peering.errors import PeerUnreachable, TransferRejected
from dfl_node.peering.messages import Ack, Offer
from dfl_node.peering.port import PeerNetwork
from dfl_node.settings.node import RoleSettings, ScheduleSettings

log = logging.getLogger("dfl_node.node.node")  # the node's own log lines, wherever the code sits


class Roles(RequestedRoles):
    """The roles of node ``node_id`` (serving at ``address()``: its own, or its relay slot). It reads its peers from
    ``members`` and reaches them over ``network``; the model is ``learner``'s; ``progress`` and ``tally`` are told
    what each role did."""

    def __init__(self, node_id: str, address: Callable[[], str], settings: RoleSettings, schedule: ScheduleSettings,
                 swarm: str,
                 clock: Clock, *, learner: Learner, progress: RoundProgress, tally: Tally, members: Members,
                 network: PeerNetwork, reporter: Reporter, defences: DefenceSettings, links: LinkQuality) -> None:
        self.node_id, self.address, self.settings, self.swarm, self.clock = node_id, address, settings, swarm, clock
        self.defences = defences  # what its sender and aggregator roles refuse to fuse (algorithms.defences)
        self.links = links  # what its transfers measured of each link
        self.rounds = schedule.mode == "round"
        self.round_timeout = schedule.round_timeout
        self.max_round_timeout = schedule.max_round_timeout
        self._work_s = 0.0  # seconds of computation the last role took (0: none yet)
        self.learner, self.progress, self.tally, self.members, self.network = learner, progress, tally, members, network
        self.reporter = reporter
        self._role = Role.IDLE
        self._collector: Collector | None = None  # the group this node aggregates now
        self._ended: Collector | None = None  # the group it aggregated last: confirmations a cut stream resumes
        self._settling: asyncio.Task | None = None  # the sender or aggregator role being played, until durable
        self._idle = asyncio.Event()  # set while no role is held
        self._idle.set()
        self._taken_at, self._bytes_at = 0.0, 0  # the node's clock and its traffic when the role was taken
        self._fusing, self._max_fusing = 0, 0

    # ----- what others read ----------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self._role

    @property
    def collector(self) -> Collector | None:
        """The group this node aggregates now, if any."""
        return self._collector

    def collector_for(self, offer: Offer) -> Collector | None:
        """The group a pushed transfer is for: the one this node aggregates now, if the offer's round and epoch are
        its; for a transfer that resumes a cut one, also the group it aggregated last (its confirmation)."""
        for collector in (self._collector, self._ended if offer.resume else None):
            if collector is not None and collector.matches(offer):
                return collector
        return None

    @property
    def work_s(self) -> float:
        """Seconds of computation this node's last role took, or before any role its estimate (0: unknown)."""
        return self._work_s or self.learner.work_estimate()

    def worked(self, transport: PeerTransport) -> None:
        """A role that computed is over: how long its computation took is this node's speed from now on."""
        if transport.computed > 0:
            self._work_s = transport.computed

    @property
    def fusing(self) -> bool:
        return self._fusing > 0

    @property
    def max_fusing(self) -> int:
        """The most fusions that ever ran here at once (one: a node plays one role at a time)."""
        return self._max_fusing

    # ----- holding a role ------------------------------------------------------------------
    def take(self, role: Role) -> None:
        if self._role is not Role.IDLE:
            self.tally.count("busy_refusals")
            raise TransferRejected("busy", f"{self.node_id} is {self._role.value}")
        self._role = role
        self._idle.clear()
        self._taken_at, self._bytes_at = self.clock.monotonic(), self._traffic()

    def _traffic(self) -> int:
        counters = self.tally.counters
        return counters["bytes_sent"] + counters["bytes_received"]

    def release(self) -> None:
        self._role = Role.IDLE
        self._idle.set()

    def stop_waiting(self) -> None:
        """The node stopped serving: no transfer can arrive any more, so a group still waiting for its senders takes
        what came now, as at its deadline, rather than holding the shutdown for up to ``round_timeout``."""
        if self._collector is not None:
            self._collector.expire()

    async def settled(self) -> None:
        """Until this node's last role (its fusion, replies, evaluation and checkpoint) is over."""
        if self._settling is not None:
            await asyncio.shield(self._settling)

    async def quiesce(self) -> None:
        """Until no role runs here: the last one settled and none (a pull's source, a probed candidate) is held."""
        while True:
            await self.settled()
            if self._role is Role.IDLE:
                return
            await self._idle.wait()

    def fusion_started(self) -> None:
        self._fusing += 1
        self._max_fusing = max(self._max_fusing, self._fusing)

    async def exchanged(self, event: Literal["send", "fusion"], round_: int, peer: str) -> None:
        """A send or a fusion changed the model at ``round_`` (the round it completes): evaluated if a point of
        the curve falls there, counted, recorded with the role's time and traffic so far, checkpointed, and said
        in the node's INFO line."""
        took: list[tuple[float, int]] = []

        def detail() -> dict[str, float | int | str]:  # once the model is measured: the role's time includes it
            self.tally.count("rounds_completed")
            took.append((self.clock.monotonic() - self._taken_at, self._traffic() - self._bytes_at))
            return {"seconds": round(took[0][0], 3), "bytes": took[0][1]}

        evaluated = await self.learner.changed(event, round_, peer, detail)
        seconds, moved = took[0]
        self.tally.observe("role", seconds, role=self._role.value)
        self.reporter.exchange(event, self._role.value, round_, peer or "?", seconds, moved,
                               self.learner.accuracy if evaluated else None)

    def _played(self, step: Step) -> None:
        """This node completed a role in ``step``: async mode counts its exchanges; round mode records the round as
        played (checkpointed with the model next) and that rounds up to it are complete."""
        if self.rounds:
            self.progress.played_in(step.round, step.state)
        else:
            self.progress.exchanged()

    # ----- the roles of a group ------------------------------------------------------------
    async def play(self, order: Assignment) -> Ack:
        """Take a group role (a peer's Assign, or this node's own scheduler) and play it.

        Round mode: a round this node already played (its checkpoint says so) is answered ``already_played``
        and not played again, so a holder that retries a round, or regenerates the token, never makes a
        node fuse or send twice for it. A sender's Ack, and a pulling aggregator's, comes once the fusion
        is durable (``ok``) or known not to have happened (``not_fused``): the holder must not move on
        from a round whose fusion a crash can still undo.
        """
        step = order.step
        if self.rounds:
            self._give_up_stale(order)
            await self.settled()  # the plan chose us: the last role's checkpoint first, then this one
            if step.round <= self.progress.played:
                return Ack(ok=True, reason="already_played")
        try:
            self.take(order.role)
        except TransferRejected as exc:
            return Ack(ok=False, reason=exc.reason)
        loop = asyncio.get_running_loop()
        if order.role is Role.SENDER:
            accepted: asyncio.Future[bool] = loop.create_future()
            transport = PeerTransport(self, order, aggregator_address=order.aggregator_address, accepted=accepted)
            sending = self._settling = loop.create_task(self._play_sender(step, transport))
            ok = await asyncio.shield(sending if self.rounds else accepted)  # async: the inviter waits for "accepted"
            return Ack(ok=ok, reason="" if ok else "not_fused" if self.rounds else "transfer_failed")
        collector = self._collector = Collector(step, order.epoch, self.clock, max_bytes=self.max_buffered_bytes,
                                                deadline_s=self.deadline_of(order),
                                                assigned_by=order.holder if self.rounds and not step.group.pull else "",
                                                resume_window=self.settings.resume_window)
        fusing = self._settling = loop.create_task(self._play_aggregator(step, PeerTransport(self, order, collector)))
        if step.group.pull and self.rounds:
            ok = await asyncio.shield(fusing)
            return Ack(ok=ok, reason="" if ok else "not_fused")
        if step.group.pull:
            await asyncio.shield(collector.gathered.wait())
        return Ack(ok=True)

    def _give_up_stale(self, order: Assignment) -> None:
        """Round mode: a holder's Assign for a later round, or for our own group again, while our group still waits
        for senders none of which began to send. The holder moves on from a group only once it fused or was given
        up, and plays a group again only once it failed: our Assign's answer was lost on the way (a relay that died
        cut it), and its senders were never told. So the group stops waiting now (not fused), rather than at its
        deadline, and this role is played."""
        collector = self._collector
        if (collector is None or not collector.assigned_by or collector.gathered.is_set() or collector.messages
                or collector.receiving or collector.partials or order.epoch < collector.epoch):
            return
        step = order.step
        if step.round > collector.round or (step.round == collector.round and step.group == collector.step.group):
            log.info("%s: round %d: the holder moved on (an Assign for round %d); not waiting for %s any more",
                     self.node_id, collector.round + 1, step.round + 1, ", ".join(sorted(collector.missing())))
            collector.expire()

    def deadline_of(self, order: Assignment) -> float:
        """How long a role of ``order`` may take: an aggregator's wait for its senders, a sender's transfer until its
        fusion is confirmed. What the order asks (a holder's deadline follows its members' speed), never longer than
        our own ``max_round_timeout`` (an Assign is a peer's request: it cannot hold our only role for as long as it
        likes); ``round_timeout`` where it asks none."""
        asked = order.deadline_s
        return min(asked, self.max_round_timeout) if asked > 0 else self.round_timeout  # 0, < 0, NaN: ours

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.settings.max_buffered_mb * 1e6)

    async def lead(self, round_: int, candidates: list[str], wanted: int) -> bool:
        """Async mode: volunteer — as an aggregator that invites ``wanted`` of ``candidates`` (in order) to send,
        or pulls from them, or, where senders choose their receivers, as a sender that probes them. Returns
        whether anybody came.

        The collector exists before any invitation goes out, so a fast sender's transfer is never
        refused; invitations go out in batches until ``wanted`` accepted or the candidates run out.
        """
        shape = self.learner.algorithm.async_shape
        if shape == "select":  # 001: volunteer as a sender that chooses its receiver
            group = Group("", (self.node_id,), candidates=tuple(candidates[:wanted]))
            return (await self.play(Assignment(Role.SENDER, Step(round_, group), holder=self.node_id,
                                          deadline_s=self.round_timeout))).ok
        if shape == "pull":  # nobody to invite: pull from the first ``wanted`` candidates
            group = Group(self.node_id, tuple(candidates[:wanted]), pull=True)
            return (await self.play(Assignment(Role.AGGREGATOR, Step(round_, group)))).ok
        try:
            self.take(Role.AGGREGATOR)
        except TransferRejected:
            return False
        collector = self._collector = Collector(Step(round_, Group(self.node_id, ())), 0, self.clock, expected=(),
                                                max_bytes=self.max_buffered_bytes, deadline_s=self.round_timeout,
                                                resume_window=self.settings.resume_window)
        came: list[str] = []
        remaining = list(candidates)
        try:
            while remaining and len(came) < wanted:
                batch, remaining = remaining[: wanted - len(came)], remaining[wanted - len(came) :]
                collector.expected.update(batch)
                acks = await asyncio.gather(*(self.dispatch(peer, self._invitation(round_, peer)) for peer in batch))
                for peer, ack in zip(batch, acks):
                    if ack.ok:
                        came.append(peer)
                    else:
                        collector.withdraw(peer)
        except asyncio.CancelledError:  # the scheduler stops (shutdown): nobody will aggregate, the role is free
            came.clear()
            raise
        finally:
            if not came:
                collector.close()
                self._collector = None
                self.release()
        if not came:
            return False
        step = Step(round_, Group(self.node_id, tuple(sorted(came))))
        collector.settle_on(step)
        self._settling = asyncio.get_running_loop().create_task(
            self._play_aggregator(step, PeerTransport(self, Assignment(Role.AGGREGATOR, step), collector)))
        return True

    def _invitation(self, round_: int, peer: str) -> Assignment:
        group = Group(self.node_id, (peer,))
        return Assignment(Role.SENDER, Step(round_, group), holder=self.node_id, aggregator_address=self.address())

    def address_in(self, node_id: str, order: Assignment) -> str | None:
        """Where ``node_id`` serves: as our membership knows it, else as the holder that planned the round knew
        it (``order.addresses``). The plan was made with it, and our table may not have confirmed it yet: a pull,
        probe or bind that skipped it would play a round other than the simulator's."""
        return self.members.address_of(node_id) or order.addresses.get(node_id) or None

    async def dispatch(self, node_id: str, order: Assignment) -> Ack:
        """A role for ``node_id``: played here if it is us, else sent as an Assign (failures become an Ack)."""
        if node_id == self.node_id:
            return await self.play(order)
        address = self.address_in(node_id, order)
        if address is None:
            return Ack(ok=False, reason="unreachable")
        try:
            return await self.network.link(address).assign(order.wire(), timeout=self.deadline_of(order))
        except PeerUnreachable as exc:
            return Ack(ok=False, reason=exc.reason)

    async def _play_sender(self, step: Step, transport: PeerTransport) -> bool:
        """Returns whether the round is done for this sender: its aggregator confirmed a durable fusion of
        its model, and its own checkpoint followed. A sender whose round is not done puts its models back as
        they were (:meth:`Learner.restore_durable`): training in place (Combo, FedAvg, a sender that keeps its
        trained model) is done again when the round is played again, from the same start, so a replayed
        round ends as an unfailed one would."""
        learner = self.learner
        try:
            await learner.checkpointed()  # what this role goes back to if it fails
            await learner.settle_evaluation(step.round)  # the model this role changes, if a point needs it
            await play_sender(learner.algorithm, learner.ctx, step, transport, self.defences)
            self._played(step)
            await self.exchanged("send", step.round + 1, step.group.aggregator)
            return True
        except AlreadyPlayed as exc:
            log.info("%s: round %d: %s", self.node_id, step.round + 1, exc)
            return True
        except NonFinite as exc:  # said and undone already (the runner: transport.diverged, transport.restore)
            log.info("%s: round %d: %s", self.node_id, step.round + 1, exc)
        except (TransferFailed, SelectionFailed) as exc:
            log.info("%s: round %d: %s", self.node_id, step.round + 1, exc)
            await learner.restore_durable()
        except Exception:  # a bug must not kill the node: the role is given back, the round goes on
            log.exception("%s: round %d: the sender role failed", self.node_id, step.round + 1)
            await learner.restore_durable()
        finally:
            transport.verdict(False)
            self.worked(transport)
            self.release()
        return False

    async def _play_aggregator(self, step: Step, transport: PeerTransport) -> bool:
        """Returns whether this node fused (and checkpointed) the group. Its senders hear the outcome only
        after the checkpoint (their replies, or an end of stream), so a sender never counts a fusion that a
        crash can still undo; if nothing was fused they are told ``not_fused`` (:meth:`Collector.close`), and
        the models go back to how the role found them (its own local step undone, as a sender's)."""
        collector, learner = transport.collector, self.learner
        assert collector is not None
        try:
            await learner.checkpointed()
            await learner.settle_evaluation(step.round)
            if await play_aggregator(learner.algorithm, learner.ctx, step, transport, self.defences):
                self.tally.count("fusions")
                self._played(step)
                await self.exchanged("fusion", step.round + 1, ",".join(step.group.senders))
                collector.answer(transport.replies)
                return True
            await learner.restore_durable()
        except Exception:  # a bug (check_message passed): keep serving, the senders get no reply
            log.exception("%s: round %d: aggregating failed", self.node_id, step.round + 1)
            await learner.restore_durable()
        finally:
            self._fusing = 0
            collector.close()
            self._collector = None
            self._keep_ended(collector)
            self.worked(transport)
            self.release()
        return False

    def _keep_ended(self, collector: Collector) -> None:
        """Keep the confirmations of the group just over for ``resume_window`` seconds: a sender whose stream was
        cut while it waited for one resumes, and learns its fate, rather than playing its round again."""
        self._ended = collector
        asyncio.get_running_loop().call_later(self.settings.resume_window, self._forget_ended, collector)

    def _forget_ended(self, collector: Collector) -> None:
        if self._ended is collector:
            self._ended = None
