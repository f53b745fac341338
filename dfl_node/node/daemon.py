"""The node: one asyncio process that serves its peers, learns, and reports.

It owns the node's model (through a :class:`NodeContext`), its peer table and its counters, and
implements the RPC side of :mod:`dfl_node.net.transport`. Training and fusion run in a worker
thread (``asyncio.to_thread``) so Hello, status and transfers stay responsive; a node holds at
most one learning role at a time (sender or receiver), so a model being fused is never touched by
a concurrent transfer. Scheduling lives in :mod:`.rounds` (token rounds) and :mod:`.async_mode`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter

import grpc

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms import AlgorithmError, NodeContext, make_algorithm
from dfl_node.algorithms.messages import ModelMessage
from dfl_node.api.schemas import COUNTER_FIELDS, HistoryEntry, NodeStatus
from dfl_node.learning.datasets import load_shard
from dfl_node.learning.fleet import read_node_data
from dfl_node.learning.models import build_model, fingerprint, param_digest
from dfl_node.learning.training import evaluate
from dfl_node.net.codec import Limits, TransferRejected, manifest_of, prepare
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.net.transport import PeerClient, TransferRefused, WireIdentity
from dfl_node.node.async_mode import AsyncScheduler
from dfl_node.node.config import NodeConfig
from dfl_node.node.peers import PeerTable
from dfl_node.node.persistence import Checkpoint
from dfl_node.node.rounds import RoundScheduler

log = logging.getLogger(__name__)


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.started = time.time()
        self.boot_id = uuid.uuid4().hex
        train, val = read_node_data(config.data)
        self.test = load_shard(config.test_data) if config.test_data else None
        model = build_model(config.model, train.input_shape, train.num_classes, hidden=config.hidden, seed=config.seed)
        self.ctx = NodeContext(config.id, model, train, val, config)
        self.algorithm = make_algorithm(config.algorithm, config)
        state = model.state_dict()
        self.fingerprint = fingerprint(config.model, state)
        self.wire = WireIdentity(config.swarm, self.fingerprint, manifest_of(state), Limits())
        self.grpc_address = f"{config.advertised_host}:{config.grpc_port}"
        self.checkpoint = Checkpoint(config.state_path)
        self.counters: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.history: list[HistoryEntry] = []
        self.round = 0  # rounds completed (round mode) or sends started (async mode)
        self.epoch = 0
        self.done = False
        self.role = "idle"
        self.holding = False
        self.fusing = 0
        self.max_fusing = 0
        self.accuracy: tuple[float | None, float | None] = (None, None)  # (local, global) of the current model
        self.clients: dict[str, PeerClient] = {}
        self.ready = asyncio.Event()  # set once gRPC, REST and discovery are up
        self.starting = True  # until start-up has passed its checks: a duplicate id then aborts it
        self.duplicate: str | None = None  # why start-up must stop: another live node has our id
        self._impostors: set[str] = set()  # boot ids of live nodes with our id, each reported once
        self._settling: asyncio.Task | None = None
        self.peers = PeerTable(config.id, self._probe, heartbeat=config.heartbeat, timeout=config.peer_timeout,
                               static=config.peers, on_join=lambda *joined: self.scheduler.on_join(*joined))
        self._restore()
        self.digest = param_digest(self.ctx.model.state_dict())
        self.scheduler = RoundScheduler(self) if config.mode == "round" else AsyncScheduler(self)

    # ----- persistence -------------------------------------------------------------------
    def _restore(self) -> None:
        saved = self.checkpoint.load(self.fingerprint)
        if saved is None:
            return
        model_state, state = saved
        self.ctx.model.load_state_dict(model_state)
        self.round, self.epoch = state.get("round", 0), state.get("epoch", 0)
        self.done = self._done_at(self.round)
        self.counters.update(state.get("counters", {}))
        self.history = [HistoryEntry.model_validate(h) for h in state.get("history", [])]
        if self.history:
            self.accuracy = (self.history[-1].local_accuracy, self.history[-1].global_accuracy)
        limit = f" of {self.config.rounds}" if self.config.mode == "round" and self.config.rounds else ""
        log.info("%s resuming at round %d%s%s (checkpoint in %s)", self.config.id, self.round, limit,
                 ", already done" if self.done else "", self.checkpoint.directory)

    def _done_at(self, round_: int) -> bool:
        """Whether a checkpoint at ``round_`` is finished under the settings given *now*, not those saved:
        a node restarted with more ``--rounds`` goes on; in async mode a restarted node volunteers again."""
        rounds = self.config.rounds
        return self.config.mode == "round" and rounds > 0 and round_ >= rounds

    def _state(self) -> dict:
        return {"round": self.round, "epoch": self.epoch, "done": self.done, "counters": dict(self.counters),
                "history": [h.model_dump(mode="json") for h in self.history]}

    async def save(self) -> None:
        """Checkpoint without copying the model: callers hold the learning role, so nothing changes it meanwhile."""
        await asyncio.to_thread(self.checkpoint.save, self.ctx.model.state_dict(), self.fingerprint, self._state())

    # ----- learning roles ----------------------------------------------------------------
    def take_role(self, role: str) -> None:
        if self.role != "idle":
            self.counters["busy_refusals"] += 1
            raise TransferRejected("busy", f"{self.config.id} is {self.role}")
        self.role = role

    def release_role(self) -> None:
        self.role = "idle"

    async def model_changed(self, event: str, round_: int, peer: str | None) -> None:
        """After every fusion: evaluate, fingerprint the values, checkpoint, record.

        Evaluation and the sha256 of a possibly large model run in the worker thread, off the event loop.
        """
        self.accuracy, self.digest = await asyncio.to_thread(self._measure)
        if event in ("send", "fusion"):
            self.counters["rounds_completed"] += 1
        local, global_ = self.accuracy
        self.history.append(HistoryEntry(round=round_, time=time.time(), event=event, role=self.role, peer=peer,
                                         local_accuracy=local, global_accuracy=global_))
        await self.save()

    def _measure(self) -> tuple[tuple[float | None, float | None], str]:
        accuracy = self._evaluate() if self.config.evaluate else self.accuracy
        return accuracy, param_digest(self.ctx.model.state_dict())

    def _evaluate(self) -> tuple[float | None, float | None]:
        local = evaluate(self.ctx.model, self.ctx.val).accuracy if len(self.ctx.val) else None
        global_ = evaluate(self.ctx.model, self.test).accuracy if self.test is not None else None
        return local, global_

    async def send(self, round_: int, epoch: int, targets: list[tuple[str, str]]) -> str | None:
        """Sender role: train, then push to the first target (id, address) that accepts; returns its id.

        The work runs as its own task, shielded: if our caller is cancelled (an RPC deadline), the
        worker thread still runs on, so the role stays taken until it has really finished.
        """
        if self.config.mode == "round":
            await self.settled()  # the plan chose us: the last fusion's checkpoint first, then this round
        self.take_role("sender")
        return await asyncio.shield(asyncio.get_running_loop().create_task(self._send(round_, epoch, targets)))

    async def _send(self, round_: int, epoch: int, targets: list[tuple[str, str]]) -> str | None:
        try:
            message = await asyncio.to_thread(self.algorithm.sender_step, self.ctx, round_)
            outgoing = await asyncio.to_thread(prepare, message, swarm=self.config.swarm, fingerprint=self.fingerprint,
                                               epoch=epoch)  # hashed once, whatever the number of attempts
            for peer_id, address in targets:
                try:
                    reply, sent, received = await self.client(address).push(outgoing, timeout=self.config.round_timeout)
                except (TransferRefused, grpc.aio.AioRpcError) as exc:
                    reason = exc.reason if isinstance(exc, TransferRefused) else exc.code().name
                    log.info("%s → %s refused or failed: %s", self.config.id, peer_id, reason)
                    continue
                self.counters.update(models_sent=1, bytes_sent=sent, bytes_received=received)
                await asyncio.to_thread(self.algorithm.sender_finish, self.ctx, reply)
                await self.model_changed("send", round_ + 1, peer_id)
                return peer_id
            return None
        finally:
            self.release_role()

    def client(self, address: str) -> PeerClient:
        if address not in self.clients:
            self.clients[address] = PeerClient(address, self.wire)
        return self.clients[address]

    # ----- RPC handlers (dfl_node.net.transport.NodeHandler) -------------------------------
    def hello_message(self, cls: type = pb.HelloRequest, **extra: object):  # noqa: ANN201
        return cls(protocol_version=PROTOCOL_VERSION, swarm=self.config.swarm, node_id=self.config.id,
                   fingerprint=self.fingerprint, algorithm=self.config.algorithm, boot_id=self.boot_id,
                   grpc_address=self.grpc_address, http_port=self.config.http_port,
                   status_url=self.config.status_url or "", **extra)

    def incompatibility(self, other: pb.HelloRequest | pb.HelloReply) -> str | None:
        if other.protocol_version != PROTOCOL_VERSION:
            return "protocol_version"
        if other.swarm != self.config.swarm:
            return "swarm_mismatch"
        if other.fingerprint != self.fingerprint:
            return "fingerprint_mismatch"
        if other.algorithm != self.config.algorithm:
            return "algorithm_mismatch"
        return None

    def hello(self, request: pb.HelloRequest, peer: str) -> pb.HelloReply:
        reason = self.incompatibility(request)
        if reason:
            self.rejected_hello(reason, request, peer)
            return self.hello_message(pb.HelloReply, accepted=False, reason=reason)
        if self.is_duplicate(request):
            self.on_duplicate(request.boot_id, request.grpc_address or peer)
            return self.hello_message(pb.HelloReply, accepted=False, reason="duplicate_id")
        self.peers.seen(request)
        return self.hello_message(pb.HelloReply, accepted=True)

    def rejected_hello(self, reason: str, other: pb.HelloRequest, where: str) -> None:
        self.rejected[reason] += 1
        log.warning("refused %s (%s) at hello: %s (theirs swarm=%r fingerprint=%s…, ours swarm=%r fingerprint=%s…)",
                    other.node_id, where, reason, other.swarm, other.fingerprint[:12], self.config.swarm,
                    self.fingerprint[:12])

    async def _probe(self, address: str) -> pb.HelloReply | None:
        """Heartbeat: our Hello to ``address``; only compatible peers count as alive."""
        try:
            reply = await self.client(address).hello(self.hello_message(), timeout=min(self.config.heartbeat, 2.0))
        except grpc.aio.AioRpcError:
            return None
        if reply.node_id == self.config.id:  # ourselves (our own address in a static list), or a duplicate
            if self.is_duplicate(reply):
                self.on_duplicate(reply.boot_id, address)
            return None
        reason = reply.reason if not reply.accepted else self.incompatibility(reply)
        if reason:  # the peer counts its refusal of us; we just leave it out of the table
            log.debug("%s at %s is incompatible: %s", reply.node_id, address, reason)
            return None
        return reply

    def is_duplicate(self, other: pb.HelloRequest | pb.HelloReply) -> bool:
        """Another live node of our swarm with our id: same id and swarm, another boot."""
        return other.node_id == self.config.id and other.swarm == self.config.swarm and other.boot_id != self.boot_id

    def on_duplicate(self, boot_id: str, address: str) -> None:
        """While starting, a duplicate id stops the start (service checks ``duplicate``); a running node
        keeps serving, but says so loudly, once per impostor, and counts it in ``rejected``."""
        problem = (f"node id {self.config.id!r} is already used by another running node at {address}; "
                   "give every node its own --id")
        if self.starting:
            self.duplicate = self.duplicate or problem
            return
        if boot_id not in self._impostors:
            self._impostors.add(boot_id)
            self.rejected["duplicate_id"] += 1
            log.error("%s", problem)

    async def admit(self, header: pb.TransferHeader) -> None:
        if self.config.mode == "round":
            if header.epoch < self.epoch:
                raise TransferRejected("stale_epoch", f"epoch {header.epoch} < {self.epoch}")
            await self.settled()  # the round plan chose us: finish checkpointing the last fusion, don't refuse
        self.take_role("receiver")

    def release(self, header: pb.TransferHeader) -> None:
        self.release_role()

    def receive(self, message: ModelMessage) -> asyncio.Future[ModelMessage | None] | None:
        """Take a message the codec validated: check it against the algorithm, then fuse it in the background.

        Raises :class:`TransferRejected` when the algorithm cannot fuse it. Otherwise, from here the
        node owns the receiver role and frees it itself once the fusion is settled (evaluated and
        checkpointed), never while the worker thread may still touch the model. Returns a future of
        the reply for an algorithm that replies (Combo), None for the others: their sender is answered
        at once, without waiting for the fusion.
        """
        try:
            self.algorithm.check_message(self.ctx, message)
        except AlgorithmError as exc:
            raise TransferRejected("algorithm", str(exc)) from exc
        self.counters["models_received"] += 1
        reply: asyncio.Future[ModelMessage | None] = asyncio.get_running_loop().create_future()
        self._settling = asyncio.get_running_loop().create_task(self._fuse(message, reply))
        return reply if self.algorithm.replies else None

    async def _fuse(self, message: ModelMessage, reply: asyncio.Future[ModelMessage | None]) -> None:
        self.fusing += 1
        self.max_fusing = max(self.max_fusing, self.fusing)
        try:
            try:
                result = await asyncio.to_thread(self.algorithm.receiver_step, self.ctx, message)
            finally:
                self.fusing -= 1
            self.counters["fusions"] += 1
            if not reply.done():  # done: the RPC that waited for it was cancelled
                reply.set_result(result)
            await self.model_changed("fusion", message.round + 1, message.sender)
        except Exception:  # a bug (check_message passed): keep serving, the sender gets no reply
            log.exception("%s: fusing the model from %s failed", self.config.id, message.sender)
            if not reply.done():
                reply.set_result(None)
        finally:
            self.release_role()

    async def settled(self) -> None:
        """Until the last received model is fused, evaluated and checkpointed."""
        if self._settling is not None:
            await asyncio.shield(self._settling)

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        self.rejected[reason] += 1
        log.warning("rejected a transfer from %s: %s (%s)", sender, reason, detail)

    def on_transferred(self, sent: int, received: int) -> None:
        self.counters.update(bytes_sent=sent, bytes_received=received)

    async def assign(self, request: pb.RoundAssignment) -> pb.Ack:
        return await self.scheduler.assign(request)

    async def token(self, request: pb.RoundToken) -> pb.Ack:
        return await self.scheduler.token(request)

    # ----- reporting ---------------------------------------------------------------------
    def status(self) -> NodeStatus:
        local, global_ = self.accuracy
        role = self.role if self.role != "idle" or not self.holding else "holder"
        return NodeStatus(
            id=self.config.id, swarm=self.config.swarm, algorithm=self.config.algorithm, mode=self.config.mode,
            round=self.round, role=role, peers=self.peers.infos(), local_accuracy=local, global_accuracy=global_,
            **{name: self.counters[name] for name in COUNTER_FIELDS}, rejected=dict(self.rejected),
            boot_id=self.boot_id, uptime_s=time.time() - self.started, grpc_address=self.grpc_address,
            http_port=self.config.http_port, param_sha256=self.digest, fusing=self.fusing > 0,
            max_concurrent_fusions=self.max_fusing, epoch=self.epoch, done=self.done and self.role == "idle",
        )

    def get_history(self) -> list[HistoryEntry]:
        return list(self.history)
