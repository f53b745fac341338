"""The role-playing half of a :class:`~dfl_node.node.daemon.Node`: taking a role, playing it, giving it back.

A node plays at most one role at a time (:class:`Role`). A sender or aggregator role runs as a task
(``_settling``) through the round runner over :class:`PeerTransport` and is held until its work is
checkpointed; the next role, in round mode, waits for it (:meth:`Roles.settled`). Async mode's
volunteering (:meth:`Roles.lead`) lives here too. The rest of the node (model, state, persistence,
evaluation, reporting) is :class:`~dfl_node.node.daemon.Node`, which holds its :class:`Roles`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dfl_node.algorithms import Group, Role, Step
from dfl_node.algorithms.runner import SelectionFailed, play_aggregator, play_sender
from dfl_node.node.collector import Collector
from dfl_node.node.exchange import AlreadyPlayed, PeerTransport, TransferFailed
from dfl_node.peering.errors import PeerUnreachable, TransferRejected
from dfl_node.peering.messages import Ack, Assignment

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger("dfl_node.node.daemon")  # the node's own log lines, wherever the code sits


class Roles:
    """The roles of one node: the one it holds (``node.state.role``), the task that plays it, the group it
    aggregates (``collector``), and whether it is idle. The node's model, state and persistence stay the
    node's; a role reads and changes them through ``node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.collector: Collector | None = None  # the group this node aggregates now
        self._settling: asyncio.Task | None = None  # the sender or aggregator role being played, until durable
        self._idle = asyncio.Event()  # set while no role is held
        self._idle.set()
        self._taken_at, self._bytes_at = 0.0, 0  # the node's clock and its traffic when the role was taken
        self._releasing: set[asyncio.Task] = set()  # _release_unassigned tasks under way

    def take_role(self, role: Role) -> None:
        if self.node.state.role is not Role.IDLE:
            self.node.state.counters["busy_refusals"] += 1
            raise TransferRejected("busy", f"{self.node.config.id} is {self.node.state.role.value}")
        self.node.state.role = role
        self._idle.clear()
        self._taken_at, self._bytes_at = self.node.clock.monotonic(), self._traffic()

    def _traffic(self) -> int:
        counters = self.node.state.counters
        return counters["bytes_sent"] + counters["bytes_received"]

    def elapsed(self) -> tuple[float, int]:
        """Seconds since the role held now was taken, and the bytes this node sent and received meanwhile."""
        return self.node.clock.monotonic() - self._taken_at, self._traffic() - self._bytes_at

    def release_role(self) -> None:
        self.node.state.role = Role.IDLE
        self._idle.set()

    # ----- peers that leave or restart while a group waits for them -------------------------
    def peer_lost(self, peer_id: str) -> None:
        """A peer stopped answering: an aggregator no longer waits for it (it would only wait for its deadline),
        unless its transfer is under way (that stream ends on its own, or after ``stream_timeout``); nor for the
        senders of a holder that is gone (:meth:`_holder_gone`)."""
        collector = self.collector
        if collector is not None and peer_id in collector.missing() and peer_id not in collector.receiving:
            log.info("%s: round %d: sender %s is gone; not waiting for it", self.node.config.id,
                     collector.round + 1, peer_id)
            collector.withdraw(peer_id)
        self._holder_gone(peer_id, "is gone")

    def peer_joined(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined. One that *restarted* (a new boot id: it crashed and came back, faster than
        ``peer_timeout`` perhaps, so it was never seen to leave) cannot still be sending what its old
        incarnation was assigned: an aggregator stops waiting for it at once, a transfer of it under way
        included, rather than until its deadline (``round_timeout``: a 130 s stall in a storm); nor can it still
        assign the senders it had not yet (:meth:`_holder_gone`)."""
        if not restarted:
            return
        collector = self.collector
        if collector is not None and peer_id in collector.missing():
            log.info("%s: round %d: sender %s restarted; not waiting for it", self.node.config.id,
                     collector.round + 1, peer_id)
            collector.abandon(peer_id)
        self._holder_gone(peer_id, "restarted")

    def _holder_gone(self, peer_id: str, how: str) -> None:
        """The holder that assigned our aggregator role crashed, perhaps between our Assign and its senders'. An
        aggregator that waited for them until its deadline (``round_timeout``) also kept the lost token from being
        regenerated, as its role counts as the token at work: a 62 s stall in a storm. It stops waiting for the
        senders the holder never assigned (:meth:`_release_unassigned`)."""
        collector = self.collector
        if collector is None or collector.assigned_by != peer_id or collector.gathered.is_set():
            return
        task = asyncio.get_running_loop().create_task(self._release_unassigned(collector, peer_id, how))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_unassigned(self, collector: Collector, holder: str, how: str) -> None:
        """Which of the senders we still wait for did the holder assign before it died? Those that play a role
        now: a sender takes its role on its Assign and keeps it until its transfer is confirmed, and in round
        mode no other role is played meanwhile. So every peer is asked where it stands (a Hello each), and the
        group stops waiting for the senders that play none (:meth:`Collector.release`); the others were told to
        send, will (a sender trains first), and their models are fused as if the holder had lived."""
        await self.node.peers.refresh()
        if self.collector is not collector or collector.gathered.is_set():
            return
        progress = self.node.peers.progress()
        released = collector.release(lambda sender: sender in progress and progress[sender].busy)
        if released:
            log.info("%s: round %d: holder %s %s; not waiting for %s, which it never assigned", self.node.config.id,
                     collector.round + 1, holder, how, ", ".join(sorted(released)))

    async def settled(self) -> None:
        """Until this node's last role (its fusion, replies, evaluation and checkpoint) is over."""
        if self._settling is not None:
            await asyncio.shield(self._settling)

    async def quiesce(self) -> None:
        """Until no role runs here: the last one settled and none (a pull's source, a probed candidate) is held."""
        while True:
            await self.settled()
            if self.node.state.role is Role.IDLE:
                return
            await self._idle.wait()

    def fusion_started(self) -> None:
        self.node.state.fusing += 1
        self.node.state.max_fusing = max(self.node.state.max_fusing, self.node.state.fusing)

    async def play(self, assignment: Assignment) -> Ack:
        """Take a group role (from the Assign RPC or from this node's own scheduler); see the proto's Assign.

        Round mode: a round this node already played (its checkpoint says so) is answered ``already_played``
        and not played again, so a holder that retries a round, or regenerates the token, never makes a
        node fuse or send twice for it. A sender's Ack, and a pulling aggregator's, comes once the fusion
        is durable (``ok``) or known not to have happened (``not_fused``): the holder must not move on
        from a round whose fusion a crash can still undo.
        """
        try:
            role = Role(assignment.role)
        except ValueError:
            return Ack(ok=False, reason="unknown_role")
        if role not in (Role.SENDER, Role.AGGREGATOR) or (assignment.candidates and role is not Role.SENDER):
            return Ack(ok=False, reason="unknown_role")
        group = Group(assignment.aggregator, tuple(assignment.senders), assignment.pull, tuple(assignment.candidates))
        step = Step(assignment.round, group, dict(assignment.state))
        rounds = self.node.config.mode == "round"
        if rounds:
            await self.settled()  # the plan chose us: the last role's checkpoint first, then this one
            if assignment.round <= self.node.state.played:
                return Ack(ok=True, reason="already_played")
        try:
            self.take_role(role)
        except TransferRejected as exc:
            return Ack(ok=False, reason=exc.reason)
        loop = asyncio.get_running_loop()
        if role is Role.SENDER:
            accepted: asyncio.Future[bool] = loop.create_future()
            transport = PeerTransport(self.node, assignment.epoch, aggregator_address=assignment.aggregator_address,
                                      accepted=accepted, assignment=assignment)
            sending = self._settling = loop.create_task(self._play_sender(step, transport))
            ok = await asyncio.shield(sending if rounds else accepted)  # async: the inviter waits for "accepted" only
            return Ack(ok=ok, reason="" if ok else "not_fused" if rounds else "transfer_failed")
        collector = self.collector = Collector(step, assignment.epoch, self.node.clock,
                                               max_bytes=self.max_buffered_bytes,
                                               deadline_s=self.deadline_of(assignment),
                                               assigned_by=assignment.holder if rounds and not group.pull else "")
        fusing = self._settling = loop.create_task(self._play_aggregator(
            step, PeerTransport(self.node, assignment.epoch, collector=collector, assignment=assignment)))
        if group.pull and rounds:
            ok = await asyncio.shield(fusing)
            return Ack(ok=ok, reason="" if ok else "not_fused")
        if group.pull:
            await asyncio.shield(collector.gathered.wait())
        return Ack(ok=True)

    def deadline_of(self, assignment: Assignment) -> float:
        """How long an aggregator waits for its senders: what the assignment asks, never longer than our own
        ``round_timeout`` (an Assign is a peer's request: it cannot hold our only role for as long as it likes)."""
        asked, ours = assignment.deadline_s, self.node.config.round_timeout
        return min(asked, ours) if asked > 0 else ours  # 0, < 0, NaN: ours

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.node.config.max_buffered_mb * 1e6)

    async def lead(self, round_: int, candidates: list[str], wanted: int) -> bool:
        """Async mode: volunteer as an aggregator and invite ``wanted`` of ``candidates`` (in order) to send.

        The collector exists before any invitation goes out, so a fast sender's transfer is never
        refused; invitations go out in batches until ``wanted`` accepted or the candidates run out.
        Returns whether anybody came.
        """
        shape = self.node.algorithm.async_shape
        if shape == "select":  # 001: volunteer as a sender that chooses its receiver
            limit = self.node.config.selection_candidates or len(candidates)
            chooser = Assignment(round=round_, role=Role.SENDER.value, holder=self.node.config.id,
                                 senders=(self.node.config.id,), candidates=tuple(candidates[:limit]),
                                 deadline_s=self.node.config.round_timeout)
            return (await self.play(chooser)).ok
        if shape == "pull":  # nobody to invite: pull from the first ``wanted`` candidates
            pull = Assignment(round=round_, role=Role.AGGREGATOR.value, aggregator=self.node.config.id,
                              senders=tuple(candidates[:wanted]), pull=True)
            return (await self.play(pull)).ok
        try:
            self.take_role(Role.AGGREGATOR)
        except TransferRejected:
            return False
        config = self.node.config
        collector = self.collector = Collector(Step(round_, Group(config.id, ())), 0, self.node.clock, expected=(),
                                               max_bytes=self.max_buffered_bytes, deadline_s=config.round_timeout)
        came: list[str] = []
        remaining = list(candidates)
        try:
            while remaining and len(came) < wanted:
                batch, remaining = remaining[: wanted - len(came)], remaining[wanted - len(came) :]
                collector.expected.update(batch)
                acks = await asyncio.gather(*(self.assign_to(peer, self._invitation(round_, peer)) for peer in batch))
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
                self.collector = None
                self.release_role()
        if not came:
            return False
        step = Step(round_, Group(self.node.config.id, tuple(sorted(came))))
        collector.step = step
        self._settling = asyncio.get_running_loop().create_task(
            self._play_aggregator(step, PeerTransport(self.node, 0, collector=collector)))
        return True

    def _invitation(self, round_: int, peer: str) -> Assignment:
        return Assignment(round=round_, epoch=0, holder=self.node.config.id, role=Role.SENDER.value,
                          aggregator=self.node.config.id, aggregator_address=self.node.grpc_address, senders=(peer,))

    def address_in(self, node_id: str, assignment: Assignment | None) -> str | None:
        """Where ``node_id`` serves: as our peer table knows it, else as the holder that planned the round knew
        it (``assignment.addresses``). The plan was made with it, and our table may not have confirmed it yet:
        a pull, probe or bind that skipped it would play a round other than the simulator's."""
        told = assignment.addresses.get(node_id) if assignment is not None else None
        return self.node.address_of(node_id) or told or None

    async def assign_to(self, node_id: str, assignment: Assignment) -> Ack:
        """A role for ``node_id``: played here if it is us, else sent as an Assign RPC (failures become an Ack)."""
        if node_id == self.node.config.id:
            return await self.play(assignment)
        address = self.address_in(node_id, assignment)
        if address is None:
            return Ack(ok=False, reason="unreachable")
        try:
            return await self.node.client(address).assign(assignment, timeout=self.node.config.round_timeout)
        except PeerUnreachable as exc:
            return Ack(ok=False, reason=exc.reason)

    async def _play_sender(self, step: Step, transport: PeerTransport) -> bool:
        """Returns whether the round is done for this sender: its aggregator confirmed a durable fusion of
        its model, and its own checkpoint followed. A sender whose round is not done puts its models back as
        they were (:meth:`Node.restore_durable`): training in place (Combo, FedAvg, a sender that keeps its
        trained model) is done again when the round is played again, from the same start, so a replayed
        round ends as an unfailed one would."""
        try:
            await self.node.checkpointed()  # what this role goes back to if it fails
            await self.node.settle_evaluation(step.round)  # the model this role changes, if a point needs it
            await play_sender(self.node.algorithm, self.node.ctx, step, transport)
            self._exchanged(step)
            await self.node.model_changed("send", step.round + 1, step.group.aggregator)
            return True
        except AlreadyPlayed as exc:
            log.info("%s: round %d: %s", self.node.config.id, step.round + 1, exc)
            return True
        except (TransferFailed, SelectionFailed) as exc:
            log.info("%s: round %d: %s", self.node.config.id, step.round + 1, exc)
            await self.node.restore_durable()
        except Exception:  # a bug must not kill the node: the role is given back, the round goes on
            log.exception("%s: round %d: the sender role failed", self.node.config.id, step.round + 1)
            await self.node.restore_durable()
        finally:
            transport._verdict(False)
            self.release_role()
        return False

    async def _play_aggregator(self, step: Step, transport: PeerTransport) -> bool:
        """Returns whether this node fused (and checkpointed) the group. Its senders hear the outcome only
        after the checkpoint (their replies, or an end of stream), so a sender never counts a fusion that a
        crash can still undo; if nothing was fused they are told ``not_fused`` (:meth:`Collector.close`), and
        the models go back to how the role found them (its own local step undone, as a sender's)."""
        assert transport.collector is not None
        try:
            await self.node.checkpointed()
            await self.node.settle_evaluation(step.round)
            if await play_aggregator(self.node.algorithm, self.node.ctx, step, transport):
                self.node.state.counters["fusions"] += 1
                self._exchanged(step)
                await self.node.model_changed("fusion", step.round + 1, ",".join(step.group.senders))
                transport.collector.answer(transport.replies)
                return True
            await self.node.restore_durable()
        except Exception:  # a bug (check_message passed): keep serving, the senders get no reply
            log.exception("%s: round %d: aggregating failed", self.node.config.id, step.round + 1)
            await self.node.restore_durable()
        finally:
            self.node.state.fusing = 0
            transport.collector.close()
            self.collector = None
            self.release_role()
        return False

    def _exchanged(self, step: Step) -> None:
        """This node completed a role in ``step``: async mode counts its exchanges; round mode records the
        round as played (checkpointed with the model next) and that rounds up to it are complete."""
        state = self.node.state
        if self.node.config.mode == "async":
            state.round += 1
            return
        state.played = max(state.played, step.round)
        if step.round + 1 > state.round:  # the token for the next round would carry the plan's state
            state.round, state.token_state = step.round + 1, dict(step.state)

