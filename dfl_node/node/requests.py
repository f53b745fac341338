"""What a node answers its peers: the :class:`~dfl_node.peering.port.PeerHandler` of a node, whichever network
carries the requests (gRPC in a daemon, memory in the simulator).

Everything here starts from a peer's request, which is checked (epoch fencing, swarm, the aggregator's
expectations, the algorithm's own check, the poisoned-model gate) before it may take a role or touch the model;
the roles themselves are :class:`~dfl_node.node.exchange.roles.Roles`'. Round mode answers a pull or a probe only after
the node's last role settled, so the model served is the one the simulator's node would serve.
"""

from __future__ import annotations

import asyncio
import logging

from dfl_node.algorithms import AlgorithmError
from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.selection import SelectsReceiver
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.arrival_checks import check_received
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.exchange.collector import Admitted, Collector
from dfl_node.node.exchange.roles import Roles
from dfl_node.node.membership.membership import Membership
from dfl_node.node.membership.reach import Reach
from dfl_node.node.model.learner import Learner
from dfl_node.node.schedule.ports import Scheduler
from dfl_node.peering import control
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import (
    Ack,
    DialBackRequest,
    Hello,
    HelloReply,
    Offer,
    Ping,
    PingAck,
    PullRequest,
    ReserveRequest,
    Token,
)
from dfl_node.peering.messages import Assignment as WireAssignment
from dfl_node.peering.probes import ProbeReply, ProbeRequest, probe_from_request, probe_reply
from dfl_node.settings.node import RoleSettings, ScheduleSettings

log = logging.getLogger(__name__)


class Intake:
    """One transfer admitted into an aggregator's collector (:class:`dfl_node.peering.port.Intake`)."""

    def __init__(self, requests: PeerRequests, collector: Collector, offer: Offer, admitted: Admitted) -> None:
        self.requests, self.collector, self.offer = requests, collector, offer
        self.held, self.arrived = admitted.held, admitted.arrived
        self.admitted_at = requests.clock.monotonic()  # the transfer's first frame came in

    @property
    def sender(self) -> str:
        return self.offer.sender

    async def deliver(self, message: ModelMessage) -> asyncio.Future[ModelMessage | None] | None:
        requests, learner = self.requests, self.requests.learner
        message = on_device(message, learner.device)  # decoded on the CPU, fused on the node's device
        try:
            learner.algorithm.check_message(learner.ctx, message)
        except AlgorithmError as exc:
            raise TransferRejected("algorithm", str(exc)) from exc
        await asyncio.to_thread(check_received, learner.ctx, message, requests.roles_settings.min_accuracy)
        if requests.rounds and self.collector.epoch < requests.progress.epoch:  # fenced while it streamed
            raise TransferRejected("stale_epoch", f"epoch {self.collector.epoch} < {requests.progress.epoch}")
        took = requests.clock.monotonic() - self.admitted_at
        requests.tally.count("models_received")
        requests.tally.observe("transfer", took, direction="received")
        # its throughput, where one stream carried it all (a resumed one's spans its cuts)
        requests.roles.links.transferred(self.sender, "received", self.offer.total_size, 0.0 if self.offer.resume
                                         else took)
        return self.collector.deliver(message, self.offer.digest)  # resolved once the fusion is durable

    def interrupt(self, held: object, detail: str) -> None:
        """The stream ended before its payload did: cut, as far as a receiver can tell (a sender that dies looks the
        same). A member's transfer is kept for it to resume (:meth:`Collector.interrupt`); a stranger's is refused
        (``truncated``) and its sender no longer waited for, as a stream that breaks off is."""
        requests = self.requests
        if self.sender in requests.membership.alive_ids() and self.collector.resume_window > 0:
            requests.tally.count("transfers_cut")
            requests.roles.links.cut(self.sender)
            log.info("%s: round %d: the transfer from %s was cut (%s); kept %g s for it to resume", requests.node_id,
                     self.offer.round + 1, self.sender, detail, self.collector.resume_window)
            self.collector.interrupt(self.sender, self.offer.digest, held)
            return
        requests.tally.reject("truncated", detail, self.sender)
        self.abandon()

    def abandon(self) -> None:
        self.collector.abandon(self.sender)


class PeerRequests:
    """The :class:`~dfl_node.peering.port.PeerHandler` of node ``node_id``: a peer's Hello goes to its
    ``membership``, a role to its ``scheduler``, a transfer, a pull or a probe to its ``roles``."""

    def __init__(self, node_id: str, swarm: str, schedule: ScheduleSettings, roles_settings: RoleSettings,
                 clock: Clock, *, membership: Membership, roles: Roles, scheduler: Scheduler, progress: RoundProgress,
                 learner: Learner, tally: Tally, reach: Reach) -> None:
        self.node_id, self.swarm, self.schedule, self.roles_settings, self.clock = (node_id, swarm, schedule,
                                                                                    roles_settings, clock)
        self.rounds = schedule.mode == "round"
        self.membership, self.roles, self.scheduler, self.progress = membership, roles, scheduler, progress
        self.learner, self.tally = learner, tally
        self.reach = reach  # dial-backs it makes for others, and whether it relays them

    def hello(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        return self.membership.answer(request, peer, refused)

    async def ping(self, request: Ping) -> PingAck:
        return await self.membership.ping(request)

    async def dial_back(self, request: DialBackRequest) -> Ack:
        return await self.reach.dial_back(request, self.membership.dial)

    async def reserve(self, request: ReserveRequest) -> Ack:
        """Whether the caller may hold a relay slot here (the bytes are the network's)."""
        return self.reach.may_relay(request.swarm)

    async def admit(self, offer: Offer) -> Intake:
        """A transfer is wanted only by an aggregator whose group names its sender, for that round and epoch."""
        if self.rounds and offer.epoch < self.progress.epoch:
            raise TransferRejected("stale_epoch", f"epoch {offer.epoch} < {self.progress.epoch}")
        collector = self.roles.collector_for(offer)
        if collector is None:
            raise TransferRejected("not_expected", f"{self.node_id} aggregates no group of round {offer.round} "
                                                   f"(epoch {offer.epoch}) now")
        admitted = collector.admit(offer)
        log.info("%s: round %d: %s %s (%s) from %s", self.node_id, offer.round + 1,
                 "confirming" if admitted.arrived else "resuming" if admitted.held else "taking", offer.purpose,
                 offer.model, offer.sender)  # the transfer log: what reached this node, and of which architecture
        return Intake(self, collector, offer, admitted)

    async def pull(self, request: PullRequest) -> ModelMessage:
        """Serve our model to a pulling aggregator (a pull group's source), as the algorithm transmits it."""
        if request.swarm != self.swarm:
            raise TransferRejected("swarm_mismatch", f"pull for swarm {request.swarm!r}")
        if self.rounds:
            if request.epoch < self.progress.epoch:
                raise TransferRejected("stale_epoch", f"epoch {request.epoch} < {self.progress.epoch}")
            await self.roles.settled()
        return await self.roles.serve_pull(request.round, request.aggregator, dict(request.state))

    async def probe(self, request: ProbeRequest) -> ProbeReply:
        """Answer a selecting sender's probe (001) with our current model, after our last role settled."""
        if not isinstance(self.learner.algorithm, SelectsReceiver) or request.swarm != self.swarm:
            return ProbeReply(ok=False, reason="not_selecting" if request.swarm == self.swarm else "swarm_mismatch")
        if self.rounds:
            if request.epoch < self.progress.epoch:
                return ProbeReply(ok=False, reason="stale_epoch")
            await self.roles.settled()  # the model the simulator's candidate answers with: its last fusion done
        try:
            probe = probe_from_request(request, input_shape=self.learner.ctx.train.input_shape,
                                       num_classes=self.learner.ctx.train.num_classes)
            answer = await self.roles.answer_probe(probe)
        except TransferRejected as exc:
            if exc.reason != "busy":
                self.tally.reject(exc.reason, exc.detail, request.sender or "?")
            return ProbeReply(ok=False, reason=exc.reason)
        except AlgorithmError as exc:
            self.tally.reject("bad_probe", str(exc), request.sender or "?")
            return ProbeReply(ok=False, reason="bad_probe")
        self.tally.count("probes_answered")
        return probe_reply(answer)

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        self.tally.reject(reason, detail, sender)

    def on_transferred(self, sent: int, received: int) -> None:
        self.tally.transferred("sent", sent)
        self.tally.transferred("received", received)

    async def assign(self, request: WireAssignment) -> Ack:
        """A role from a holder (round mode) or an inviting volunteer (async mode). It must name a role a node can
        be given, and its round lie within ``round_window`` rounds of the fleet's progress as we know it: an
        honest holder's round is the fleet's newest, so a far larger one is forged or broken, and playing it
        would carry our round (and the token we may regenerate from it) off to where no honest node is (a
        refusal, counted)."""
        order = Assignment.of(request)
        if order is None:
            return Ack(ok=False, reason="unknown_role")
        newest = max([self.progress.round, *(p.round for p in self.membership.progress().values())])
        window = self.schedule.round_window
        if request.round > newest + window:
            self.tally.reject("round_window", f"round {request.round} is over {window} rounds ahead of the fleet's "
                                              f"{newest}", request.holder[:64] or "?")
            return Ack(ok=False, reason="round_window")
        return await self.scheduler.play(order)

    async def token(self, request: Token) -> Ack:
        return await self.scheduler.token(request)

    async def control(self, message: object) -> object:
        """A control message: answered by the handler registered for its type, given this node's requests."""
        return await control.answer(self, message)
