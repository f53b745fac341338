"""The node: one asyncio process that serves its peers, learns, and reports.

It owns the node's model (through a :class:`NodeContext`), its :class:`NodeState` and its peer table;
what it answers its peers' RPCs is :mod:`.requests`. A node plays at most one role at a
time (:class:`Role`: sender, aggregator or pulled source), through the round runner of
:mod:`dfl_node.algorithms.runner` over :class:`PeerTransport`; training and fusion run in worker
threads, so Hello, status and transfers stay responsive, and a role is held until its work is
evaluated and checkpointed, so a model being fused is never touched by a concurrent transfer.
*When* and *with whom* a node plays is decided by its scheduler (:mod:`.rounds` for token rounds,
:mod:`.async_mode`), which sees the node only through :class:`~dfl_node.node.ports.SchedulerPort`.

It reaches its peers only through the peer network port (:mod:`dfl_node.peering`; over gRPC, its
:class:`~dfl_node.net.links.GrpcNetwork`) and reads time only from its :class:`~dfl_node.node.clock.Clock`.

Its log lines number rounds as ``/history`` does: the round a step completes (its index + 1), so the
line of a fusion and its history entry say the same round.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from typing import Any

import torch

from dfl_node.algorithms import NodeContext, NodeProfile, Role, make_algorithm
from dfl_node.algorithms.base import equip
from dfl_node.api.metrics import NodeMetrics
from dfl_node.api.schemas import FleetEvent, FleetView, HistoryEntry, NodeStatus, SeriesAccuracy
from dfl_node.errors import OperatorError
from dfl_node.learning.devices import resolve_device, use_backends
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.models import ModelSpec, fingerprint, param_digest
from dfl_node.learning.training import evaluate
from dfl_node.net.auth import load_security
from dfl_node.net.codec import Limits, Manifest, manifest_of
from dfl_node.net.links import GrpcNetwork
from dfl_node.net.wire import WireIdentity
from dfl_node.node.async_mode import AsyncScheduler
from dfl_node.node.clock import Clock
from dfl_node.node.config import NodeConfig
from dfl_node.node.data_watch import NodeData
from dfl_node.node.eval_schedule import EvalSchedule
from dfl_node.node.handshake import Handshake
from dfl_node.node.logs import RateLimitedLog
from dfl_node.node.peers import PeerTable
from dfl_node.node.persistence import Checkpoint, load_served
from dfl_node.node.refusals import Refusals
from dfl_node.node.reports import log_summary, report_exchange
from dfl_node.node.requests import PeerRequests
from dfl_node.node.roles import Roles
from dfl_node.node.rounds import RoundScheduler
from dfl_node.node.served import ServedModel
from dfl_node.node.state import NodeState
from dfl_node.node.views import fleet_view, node_status, role_name
from dfl_node.peering.errors import PeerUnreachable
from dfl_node.peering.messages import Ack, Progress, Token
from dfl_node.peering.port import PeerLink, PeerNetwork

log = logging.getLogger(__name__)


class Node:
    """One node. ``network`` and ``clock`` are its two ports to the outside: left out, the daemon's own (gRPC
    with the config's security, and the real clock); the simulator passes its in-memory network and a clock
    that follows its virtual-time loop (:mod:`dfl_node.sim`), and everything else runs unchanged."""

    def __init__(self, config: NodeConfig, *, network: PeerNetwork | None = None, clock: Clock | None = None) -> None:
        self.config = config
        try:  # mutual TLS and/or the swarm key: checked first, and never silently left out
            self.security = load_security(config.id, tls_dir=config.tls_dir, tls_ca=config.tls_ca,
                                          tls_cert=config.tls_cert, tls_key=config.tls_key,
                                          swarm_key_file=config.swarm_key_file)
        except ValueError as exc:
            raise OperatorError(str(exc)) from None
        self.clock = clock or Clock()
        self.started = self.clock.wall()
        self.boot_id = uuid.uuid4().hex
        self.device = resolve_device(config.device)  # the shard, the test set and the model move there once
        use_backends(config.precision, config.cudnn_benchmark)
        self.data = NodeData(config, self.started)  # bad data: one line naming the file and row, exit 2
        train, val = self.data.train, self.data.val
        self.test = self.data.test.to(self.device) if self.data.test is not None else None
        spec = ModelSpec(config.model, tuple(config.hidden) if config.hidden else None)
        model = spec.build(train.input_shape, train.num_classes, seed=config.seed).to(self.device)  # w0 from the CPU
        self.ctx = NodeContext(config.id, model, spec, train.to(self.device), val.to(self.device), config)
        self.algorithm = make_algorithm(config.algorithm, config)
        equip(self.algorithm, self.ctx, config.seed)  # its extra models (DFML's peak, FML's meme), w0 as the sim's
        layout = model.state_dict()
        self.fingerprint = fingerprint(config.model, layout)
        self._layouts: dict[str, tuple[str, Manifest]] = {}
        resolve = self._layout_of if self.algorithm.architectures == "any" else None
        self.wire = WireIdentity(config.swarm, str(spec), self.fingerprint, manifest_of(layout), Limits(), resolve,
                                 wire_dtype=config.wire_dtype)
        self.grpc_address = config.grpc_address
        self.checkpoint = Checkpoint(config.state_path, fsync=config.fsync)
        self.state = NodeState(history=deque(maxlen=config.history_limit))
        self.ready = asyncio.Event()  # set once gRPC, REST and discovery are up
        self._saving = asyncio.Lock()
        # a line per refusal reason at most every 10 s; /status counts them all
        self.refusals = RateLimitedLog(log, self.clock.monotonic)
        self.refused_peers = Refusals(config.id, self.clock, self._refusal_event, grace=config.peer_timeout)
        self.metrics = NodeMetrics(config.id, self.status)  # read at each scrape: built before anything runs
        self._finished = False  # finish() ran in this process
        # async mode has no fleet-wide rounds to put points at: every change is evaluated
        self.schedule = EvalSchedule(config.eval_every if config.mode == "round" else 1, config.evaluate)
        self.roles = Roles(self)
        self.handshake = Handshake(self)
        self.network: PeerNetwork = network or GrpcNetwork(
            self.wire, self.security, self.handshake.message, connect_timeout=config.connect_timeout,
            retire_after=config.round_timeout)
        self.peers = PeerTable(config.id, self.handshake.probe, self.clock, heartbeat=config.heartbeat,
                               timeout=config.peer_timeout, static=config.peers,
                               on_join=self._peer_joined,
                               expiry=config.peer_expiry, max_pending=config.max_pending_peers,
                               on_forget=self.network.forget, on_lost=self.roles.peer_lost,
                               on_beat=lambda: self.refused_peers.warn_if_isolated(len(self.peers.alive_ids())))
        # The state dir is locked before anything reads it, and held until run_node ends: a second node
        # started on it stops with the one-line error, having read (and logged) nothing of the first's state.
        self.checkpoint.lock.acquire()
        try:
            self._restore()
            self.state.digest = param_digest(self.ctx.model.state_dict())
            self.served = ServedModel(self.algorithm, self.ctx)  # what /model, /predict and exports hold
            self.scheduler = RoundScheduler(self) if config.mode == "round" else AsyncScheduler(self)
            self.requests = PeerRequests(self)  # what the gRPC server calls
        except BaseException:
            self.checkpoint.lock.release()
            raise

    @property
    def node_id(self) -> str:
        return self.config.id

    def _layout_of(self, model: str) -> tuple[str, Manifest]:
        """Another architecture's fingerprint and manifest, built from our registry for our data (shapes
        only, on the meta device: a hostile spec of huge widths allocates nothing, and fails the size check)."""
        if model not in self._layouts:
            if not self.algorithm.fuses(str(self.ctx.spec), model):
                raise ValueError(f"{self.config.algorithm} does not fuse {model} with {self.ctx.spec}")
            spec = ModelSpec.parse(model)
            layout = spec.build(self.ctx.train.input_shape, self.ctx.train.num_classes, device="meta").state_dict()
            if len(self._layouts) >= 64:  # a bound: peers cannot grow this table without limit
                self._layouts.clear()
            self._layouts[model] = fingerprint(spec.name, layout), manifest_of(layout)
        return self._layouts[model]

    def address_of(self, node_id: str) -> str | None:
        return self.grpc_address if node_id == self.config.id else self.peers.address_of(node_id)

    def profiles(self) -> list[NodeProfile]:
        """This node and its live peers, as round plans see them."""
        return [self.ctx.profile(), *self.peers.profiles()]

    # ----- persistence -------------------------------------------------------------------
    def _restore(self) -> None:
        saved = self.checkpoint.load(self.fingerprint)
        if saved is None:
            return
        model_state, durable = saved
        self.ctx.restore_checkpoint(model_state)  # the model, and the algorithm's extra models and scalars
        self.state.restore(durable)
        newest = self.state.history[-1] if self.state.history else None
        if self.config.evaluate and newest is not None and newest.local_accuracy is None \
                and newest.global_accuracy is None:
            self.schedule.owed_since = newest.round  # the model it resumes with was never evaluated
        self.state.done = self._done_at(self.state.round)
        limit = f" of {self.config.rounds}" if self.config.mode == "round" and self.config.rounds else ""
        log.info("%s resuming at round %d%s%s (checkpoint in %s)", self.config.id, self.state.round, limit,
                 ", already done" if self.state.done else "", self.checkpoint.directory)

    def _done_at(self, round_: int) -> bool:
        """Whether a checkpoint at ``round_`` is finished under the settings given *now*, not those saved:
        a node restarted with more ``--rounds`` goes on; in async mode a restarted node volunteers again."""
        rounds = self.config.rounds
        return self.config.mode == "round" and rounds > 0 and round_ >= rounds

    async def save(self, *, copy: bool = False) -> None:
        """Checkpoint the model and the durable state, one write at a time (two would race on the same
        temporary files). A role saves the live model without copying it (on a CPU; from another device, a
        CPU copy): it holds the role, so nothing changes the model meanwhile. ``copy`` is for callers that
        hold no role (the end of a run, shutdown): it waits until no role runs and copies the model right
        then, so a role taken during the write cannot tear the checkpoint."""
        snapshot = None
        if copy:
            await self.roles.quiesce()
            snapshot = self.ctx.snapshot()
        durable = self.state.durable()
        async with self._saving:
            await asyncio.to_thread(self._save, durable, snapshot)

    async def restore_durable(self) -> None:
        """Put the models back as the newest checkpoint has them: a role that did not complete leaves nothing
        that lasts. Every change is checkpointed before the next role starts, and a role starts from a checkpoint
        (:meth:`checkpointed`), so that is the model the role found — read back from disk rather than copied before
        every role, which held one more model in memory for the whole role."""
        saved = await asyncio.to_thread(self.checkpoint.load, self.fingerprint)
        if saved is None:  # the role waited for one: the folder was emptied under the running node
            raise RuntimeError(f"{self.config.id}: no checkpoint to restore the model from")
        self.ctx.restore_checkpoint({name: tensor.to(self.device) for name, tensor in saved[0].items()})

    async def committed_model(self) -> TrainedModel | None:
        """The committed model, for ``/model`` and ``/predict`` (:mod:`.served`); None before the first checkpoint.
        The first call reads it from the checkpoint while no save runs (the files are then one whole checkpoint);
        every later save replaces the copy kept since."""
        if self.served.committed is None:
            async with self._saving:
                if self.served.committed is None and self.checkpoint.generation is not None:
                    self.served.committed = await asyncio.to_thread(load_served, self.checkpoint.directory,
                                                                    self.served.served, self.fingerprint)
        return self.served.committed

    def _save(self, durable: dict[str, Any], snapshot: dict[str, torch.Tensor] | None) -> None:
        state = self.ctx.checkpoint_state() if snapshot is None else snapshot
        model = {name: tensor.detach().cpu() for name, tensor in state.items()}
        self.checkpoint.save(model, self.fingerprint, durable, self.served.metadata())
        # the live model's tensors (no snapshot, on the CPU) are copied: the next role changes them in place
        self.served.commit(model, durable["round"], shared=snapshot is None and self.device.type == "cpu")

    async def run(self) -> None:
        """What a serving node does once it has evaluated its start (:meth:`evaluate_start`): its heartbeats and
        its scheduler, until cancelled (:func:`~dfl_node.node.service.run_node`, and the simulator's fleet)."""
        await asyncio.gather(self.peers.run(), self.scheduler.run(), self.data.watch(self))

    # ----- evaluation --------------------------------------------------------------------
    async def evaluate_start(self) -> None:
        """The w0 point of the accuracy curve, once per state dir (a restarted node has its history)."""
        if self.config.evaluate and not self.state.history:
            await self.model_changed("eval", self.state.round, None)
        await self.checkpointed()

    async def checkpointed(self) -> None:
        """Until a checkpoint exists: what a role that fails goes back to (:meth:`restore_durable`). A new node's
        first is its ``w0``, written once it serves (a start-up that fails writes nothing), or by the first role
        that comes sooner."""
        if self.checkpoint.generation is None:
            await self.save()

    async def model_changed(self, event: str, round_: int, peer: str | None) -> None:
        """After every change of the model: evaluate (on the schedule: :mod:`.eval_schedule`), fingerprint the
        values, checkpoint, record.

        Evaluation and the sha256 of a possibly large model run in the worker thread, off the event loop.
        """
        state = self.state
        evaluated = self.schedule.at_change(round_)
        accuracies, state.digest = await asyncio.to_thread(self._measure, evaluated)
        exchanged = event in ("send", "fusion")
        detail: dict[str, float | int | str] = {}
        if exchanged:
            state.counters["rounds_completed"] += 1
            seconds, moved = self.roles.elapsed()
            detail = {"seconds": round(seconds, 3), "bytes": moved}
        self._record(round_, event, accuracies, peer=peer, detail=detail)
        await self.save()
        if exchanged:
            self.metrics.observe("role", seconds, role=state.role.value)
            report_exchange(self, event, round_, peer or "?", seconds, moved, evaluated)

    async def settle_evaluation(self, upto: int | None) -> None:
        """Evaluate the standing model if it is owed (:meth:`EvalSchedule.owed`): before a role of round ``upto``
        changes it, or at the end (None; also when there is no accuracy at all yet). Recorded as an ``eval``
        entry at the round of the model, which it stood for."""
        since = self.schedule.owed(upto)
        if since is None and not (upto is None and self.config.evaluate and self.state.accuracy == (None, None)):
            return
        accuracies = await asyncio.to_thread(self.evaluate)
        self.schedule.owed_since = None
        self._record(self.state.round if since is None else since, "eval", accuracies)

    def _record(self, round_: int, event: str, accuracies: dict[str, SeriesAccuracy] | None, *,
                peer: str | None = None, detail: dict[str, float | int | str] | None = None) -> None:
        """A history entry for ``event``; ``accuracies`` (from :meth:`evaluate`, None where the model was not
        evaluated) become the node's accuracy and the entry's, the first model's as the node's own."""
        state, local, global_, others = self.state, None, None, {}
        if accuracies is not None:
            own, *_ = accuracies
            local, global_ = state.accuracy = (accuracies[own].local_accuracy, accuracies[own].global_accuracy)
            others = {name: accuracy for name, accuracy in accuracies.items() if name != own}
        state.history.append(HistoryEntry(round=round_, time=self.clock.wall(), event=event, role=state.role.value,
                                          peer=peer, local_accuracy=local, global_accuracy=global_, series=others,
                                          bytes_received=state.counters["bytes_received"], detail=detail or {}))

    def _measure(self, evaluated: bool) -> tuple[dict[str, SeriesAccuracy] | None, str]:
        return self.evaluate() if evaluated else None, param_digest(self.ctx.model.state_dict())

    def evaluate(self) -> dict[str, SeriesAccuracy]:
        """The accuracies of every model the algorithm reports, by name, the node's own first (DFML: its peak
        model; then DFML's regular model, FML's meme model): on its validation split and the global test set."""
        val, test = self.ctx.val, self.test
        return {name: SeriesAccuracy(local_accuracy=evaluate(model, val).accuracy if len(val) else None,
                                     global_accuracy=evaluate(model, test).accuracy if test is not None else None)
                for name, model in self.algorithm.reported_models(self.ctx).items()}

    async def finish(self, round_: int) -> None:
        """The fleet is done at ``round_``: settle the last role, make sure there is an accuracy, checkpoint. Both
        the final announcement and a done peer's heartbeat can say so: the summary is logged once."""
        first, self._finished = not self._finished, True
        await self.roles.settled()  # the last round's aggregator may still be fusing: its model is the final one
        self.state.round, self.state.done = round_, True
        await self.settle_evaluation(None)
        await self.save(copy=True)
        if first:
            log_summary(self, f"done after {round_} rounds")

    # ----- the scheduler port (dfl_node.node.ports.SchedulerPort) ------------------------
    def enter_epoch(self, epoch: int) -> bool:
        if epoch < self.state.epoch:
            return False
        self.state.epoch = epoch
        return True

    def progress(self) -> Progress:
        """Where this node stands in round mode, for the HelloReply."""
        state = self.state
        local, global_ = state.accuracy
        return Progress(round=state.round, epoch=state.epoch, holding=state.holding, done=state.done,
                        state=dict(state.token_state), busy=state.role is not Role.IDLE, role=role_name(self),
                        local_accuracy=local, global_accuracy=global_)

    def fleet_round(self) -> int:
        """The newest round this node knows of: its own, or a live peer's at its last reply to our Hello."""
        return max([self.state.round, *(p.round for p in self.peers.progress().values())])

    def set_round(self, round_: int, token_state: dict[str, str]) -> None:
        """Rounds only advance: an announcement can arrive after the next holder's own (announcements to the
        other members go on after the hand-over), and a node that played a round already counts it."""
        if round_ >= self.state.round:
            self.state.round, self.state.token_state = round_, dict(token_state)

    def set_holding(self, holding: bool) -> None:
        if holding and not self.state.holding:
            self.state.holding_since = self.clock.wall()
        self.state.holding = holding

    def count(self, counter: str, n: int = 1) -> None:
        self.state.counters[counter] += n

    async def pass_token(self, node_id: str, token: Token) -> Ack | None:
        address = self.peers.address_of(node_id)
        if address is None:
            return None
        try:
            return await self.client(address).pass_token(token, timeout=5.0)
        except PeerUnreachable:
            return None

    async def stop_volunteering(self) -> None:
        """Async mode: the time budget is over. The node still answers others' invitations; its checkpoint
        says it is done."""
        self.state.done = True
        await self.roles.quiesce()  # the last role's model, evaluated while no role changes it
        await self.settle_evaluation(None)
        await self.save(copy=True)
        log_summary(self, f"done after {self.config.duration:.0f} s")

    def _peer_joined(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined: the role under way, then the scheduler, learn of it."""
        self.roles.peer_joined(peer_id, restarted)
        self.scheduler.on_join(peer_id, restarted)

    def client(self, address: str) -> PeerLink:
        """Our link to the peer at ``address``."""
        return self.network.link(address)

    def on_rejected(self, reason: str, detail: str, sender: str) -> None:
        """Count a refused request by reason (durable, in /status) and log it, rate-limited."""
        self.state.rejected[reason] += 1
        self._refusal_event(sender, reason)
        self.refusals.warning(reason, "rejected a request from %s: %s (%s)", sender, reason, detail[:300])

    def _refusal_event(self, peer: str, detail: str) -> None:
        self.state.recent.append(FleetEvent(time=self.clock.wall(), event="refusal", round=self.state.round,
                                            peer=peer[:64], detail=detail))

    # ----- reporting ---------------------------------------------------------------------
    def status(self) -> NodeStatus:
        return node_status(self)

    def get_history(self) -> list[HistoryEntry]:
        return list(self.state.history)

    def fleet(self) -> FleetView:
        return fleet_view(self)

    def transferred(self, direction: str, nbytes: int, seconds: float | None = None) -> None:
        """One model (or reply) crossed the wire: counted (``bytes_sent`` or ``bytes_received``), its size and,
        where the caller timed it, its transfer observed."""
        if nbytes <= 0:
            return
        self.state.counters[f"bytes_{direction}"] += nbytes
        self.metrics.observe("model_size", nbytes, direction=direction)
        if seconds is not None:
            self.metrics.observe("transfer", seconds, direction=direction)
