"""What a node answers its peers: the :class:`~dfl_node.peering.port.PeerHandler` of the daemon.

Kept apart from :class:`~dfl_node.node.daemon.Node`, which owns the model and plays the roles its
scheduler gives it: everything here starts from a peer's request, which is checked (epoch fencing,
swarm, the aggregator's expectations, the algorithm's own check, the poisoned-model gate) before it
may take a role or touch the model. Round mode answers a pull or a probe only after the node's last
role settled, so the model served is the one the simulator's node would serve.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dfl_node.algorithms import AlgorithmError, Group, Role, Step
from dfl_node.algorithms.messages import ModelMessage, on_device
from dfl_node.algorithms.selection import SelectsReceiver
from dfl_node.node.collector import Collector
from dfl_node.node.gate import check_received
from dfl_node.peering.errors import TransferRejected
from dfl_node.peering.messages import Ack, Assignment, Hello, HelloReply, Offer, PullRequest, Token
from dfl_node.peering.probes import ProbeReply, ProbeRequest, probe_from_request, probe_reply

if TYPE_CHECKING:
    from dfl_node.node.daemon import Node

log = logging.getLogger(__name__)


class Intake:
    """One transfer admitted into an aggregator's collector (:class:`dfl_node.peering.port.Intake`)."""

    def __init__(self, node: Node, collector: Collector, sender: str) -> None:
        self.node, self.collector, self.sender = node, collector, sender
        self.admitted_at = node.clock.monotonic()  # the transfer's first frame came in

    async def deliver(self, message: ModelMessage) -> asyncio.Future[ModelMessage | None] | None:
        node = self.node
        message = on_device(message, node.device)  # decoded on the CPU, fused on the node's device
        try:
            node.algorithm.check_message(node.ctx, message)
        except AlgorithmError as exc:
            raise TransferRejected("algorithm", str(exc)) from exc
        await asyncio.to_thread(check_received, node.ctx, message, node.config.min_accuracy)  # NaN/Inf, accuracy floor
        if node.config.mode == "round" and self.collector.epoch < node.state.epoch:  # fenced while it streamed
            raise TransferRejected("stale_epoch", f"epoch {self.collector.epoch} < {node.state.epoch}")
        node.state.counters["models_received"] += 1
        node.metrics.observe("transfer", node.clock.monotonic() - self.admitted_at, direction="received")
        return self.collector.deliver(message)  # resolved once the fusion is durable: the sender's confirmation

    def abandon(self) -> None:
        self.collector.abandon(self.sender)


class PeerRequests:
    """The :class:`~dfl_node.peering.port.PeerHandler` of one node; ``wire`` and ``idle_timeout`` are what
    the gRPC server needs besides (:class:`~dfl_node.net.servicer.ServedNode`)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.wire = node.wire
        self.idle_timeout = node.config.stream_timeout

    def hello(self, request: Hello, peer: str, refused: str | None = None) -> HelloReply:
        return self.node.handshake.answer(request, peer, refused)

    async def admit(self, offer: Offer) -> Intake:
        """A transfer is wanted only by an aggregator whose group names its sender, for that round and epoch."""
        node = self.node
        if node.config.mode == "round" and offer.epoch < node.state.epoch:
            raise TransferRejected("stale_epoch", f"epoch {offer.epoch} < {node.state.epoch}")
        collector = node.roles.collector
        if collector is None or not collector.matches(offer):
            raise TransferRejected("not_expected", f"{node.config.id} aggregates no group of round {offer.round} "
                                                   f"(epoch {offer.epoch}) now")
        collector.admit(offer)
        log.info("%s: round %d: taking %s (%s) from %s", node.config.id, offer.round + 1, offer.purpose, offer.model,
                 offer.sender)  # the transfer log: what reached this node, and of which architecture
        return Intake(node, collector, offer.sender)

    async def pull(self, request: PullRequest) -> ModelMessage:
        """Serve our model to a pulling aggregator (a pull group's source), as the algorithm transmits it."""
        node = self.node
        if request.swarm != node.config.swarm:
            raise TransferRejected("swarm_mismatch", f"pull for swarm {request.swarm!r}")
        if node.config.mode == "round":
            if request.epoch < node.state.epoch:
                raise TransferRejected("stale_epoch", f"epoch {request.epoch} < {node.state.epoch}")
            await node.roles.settled()
        node.roles.take_role(Role.SOURCE)
        try:
            await node.settle_evaluation(request.round)  # a pull may change the source's model (002 trains it)
            step = Step(request.round, Group(request.aggregator, (node.config.id,), pull=True), dict(request.state))
            message = await asyncio.to_thread(node.algorithm.transmit, node.ctx, step)
            node.state.counters["models_sent"] += 1
            await node.model_changed("send", request.round + 1, request.aggregator)
            return message
        finally:
            node.roles.release_role()

    async def probe(self, request: ProbeRequest) -> ProbeReply:
        """Answer a selecting sender's probe (001) with our current model, after our last role settled."""
        node = self.node
        if not isinstance(node.algorithm, SelectsReceiver) or request.swarm != node.config.swarm:
            return ProbeReply(ok=False, reason="not_selecting" if request.swarm == node.config.swarm
                              else "swarm_mismatch")
        if node.config.mode == "round":
            if request.epoch < node.state.epoch:
                return ProbeReply(ok=False, reason="stale_epoch")
            await node.roles.settled()  # the model the simulator's candidate answers with: its last fusion done
        try:
            probe = probe_from_request(request, input_shape=node.ctx.train.input_shape,
                                       num_classes=node.ctx.train.num_classes)
            node.roles.take_role(Role.CANDIDATE)
        except TransferRejected as exc:
            if exc.reason != "busy":
                node.on_rejected(exc.reason, exc.detail, request.sender or "?")
            return ProbeReply(ok=False, reason=exc.reason)
        try:
            answer = await asyncio.to_thread(node.algorithm.answer, node.ctx, probe)
        except AlgorithmError as exc:
            node.on_rejected("bad_probe", str(exc), request.sender or "?")
            return ProbeReply(ok=False, reason="bad_probe")
        finally:
            node.roles.release_role()
        node.state.counters["probes_answered"] += 1
        return probe_reply(answer)

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        self.node.on_rejected(reason, detail, sender)

    def on_transferred(self, sent: int, received: int) -> None:
        self.node.transferred("sent", sent)
        self.node.transferred("received", received)

    async def assign(self, request: Assignment) -> Ack:
        """A role from a holder (round mode) or an inviting volunteer (async mode). Its round must lie within
        ``round_window`` rounds of the fleet's progress as we know it: an honest holder's round is the fleet's
        newest, so a far larger one is forged or broken, and playing it would carry our round (and the token
        we may regenerate from it) off to where no honest node is (a refusal, counted)."""
        node = self.node
        newest = node.fleet_round()
        if request.round > newest + node.config.round_window:
            node.on_rejected("round_window", f"round {request.round} is over {node.config.round_window} rounds "
                                             f"ahead of the fleet's {newest}", request.holder[:64] or "?")
            return Ack(ok=False, reason="round_window")
        return await node.scheduler.assign(request)

    async def token(self, request: Token) -> Ack:
        return await self.node.scheduler.token(request)
