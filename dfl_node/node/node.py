"""The node: one asyncio process that serves its peers, learns, and reports — a small composition of parts, each
owning its state behind a narrow interface, so that only its owner writes a piece of state:

* :class:`~dfl_node.node.core.progress.RoundProgress`: where it stands in the fleet's rounds (round, epoch, the
  round it last played, the token it holds, whether it is done);
* :class:`~dfl_node.node.model.learner.Learner`: the model and its checkpoints (with its data, evaluation, history
  and the model served);
* :class:`~dfl_node.node.membership.membership.Membership`: who is in the fleet, read through
  :class:`~dfl_node.node.membership.membership.Members`;
* :class:`~dfl_node.node.exchange.roles.Roles`: the one role it plays at a time, over a
  :class:`~dfl_node.node.exchange.transport.PeerTransport`;
* its scheduler (:mod:`.rounds` for token rounds, :mod:`.async_mode`), given a
  :class:`~dfl_node.node.schedule.ports.SchedulerPort` of the parts it works with;
* :class:`~dfl_node.node.core.tally.Tally`: what it counts; :class:`~dfl_node.node.exchange.link_quality.LinkQuality`:
what its
  transfers measured of each link; :class:`~dfl_node.node.requests.PeerRequests`: what it answers its peers.

It reaches its peers only through the peer network port (:mod:`dfl_node.peering`), which whoever runs it builds
from the node's model (a :data:`~dfl_node.node.core.identity.NetworkFactory`: the daemon's composition root for gRPC,
mDNS and its security, :mod:`dfl_node.service`; the simulator for its memory, :mod:`dfl_node.sim`), and reads
time only from its :class:`~dfl_node.node.core.clock.Clock`.

Its log lines number rounds as ``/history`` does: the round a step completes (its index + 1), so the
line of a fusion and its history entry say the same round.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from dfl_node import PROTOCOL_VERSION
from dfl_node.algorithms import Algorithm, Role, make_algorithm
from dfl_node.algorithms.base import derive_seed
from dfl_node.learning.export import TrainedModel
from dfl_node.learning.local_data import DataView
from dfl_node.node.core.clock import Clock
from dfl_node.node.core.identity import NetworkFactory
from dfl_node.node.core.progress import RoundProgress
from dfl_node.node.core.reports import Reporter
from dfl_node.node.core.tally import Tally
from dfl_node.node.exchange.absences import Absences
from dfl_node.node.exchange.link_quality import LinkQuality
from dfl_node.node.exchange.roles import Roles
from dfl_node.node.membership.membership import Membership
from dfl_node.node.membership.reach import Reach
from dfl_node.node.model.data_watch import NodeData
from dfl_node.node.model.eval_schedule import EvalSchedule
from dfl_node.node.model.learner import Learner
from dfl_node.node.requests import PeerRequests
from dfl_node.node.schedule.async_mode import AsyncScheduler
from dfl_node.node.schedule.ports import Scheduler, SchedulerPort
from dfl_node.node.schedule.rounds import RoundScheduler
from dfl_node.node.views import fleet_view, node_status, role_name
from dfl_node.peering.messages import Hello, Progress
from dfl_node.records.fleet import FleetView
from dfl_node.records.formatting import figure
from dfl_node.records.history import HistoryEntry
from dfl_node.records.metrics import NodeMetrics
from dfl_node.records.status import NodeStatus
from dfl_node.settings.node import NodeConfig

log = logging.getLogger(__name__)


class Node:
    """One node of ``config``, over the network ``network`` builds, on ``clock``. ``algorithm``: left out, the
    config's; the simulator passes a compromised member's (:mod:`dfl_node.sim.adversaries`)."""

    def __init__(self, config: NodeConfig, network: NetworkFactory, clock: Clock, *,
                 algorithm: Algorithm | None = None) -> None:
        self.config, self.clock = config, clock
        self.started = clock.wall()
        self.boot_id = uuid.uuid4().hex
        self._hello: Hello | None = None  # our Hello as last built (:meth:`hello`)
        self._progress: tuple[tuple[object, ...], Progress] | None = None  # and our progress (:meth:`own_progress`)
        self.ready = asyncio.Event()  # set once it serves and its start is evaluated and checkpointed
        self._finished = False  # finish() ran in this process
        self.progress = RoundProgress(clock)
        self.metrics = NodeMetrics(config.id, self.status)  # read at each scrape: built before anything runs
        self.tally = Tally(clock, self.metrics, self.progress)
        self.data = NodeData(config.id, config.local, config.learning, clock)  # bad data: one line, exit 2
        algorithm = algorithm or make_algorithm(config.algorithm, config.learning, config.per_algorithm)
        schedule = config.schedule
        # async mode has no fleet-wide rounds to put points at: every change is evaluated
        evaluation = EvalSchedule(config.evaluation.eval_every if schedule.mode == "round" else 1,
                                  config.evaluation.evaluate)
        self.learner = Learner(config.id, algorithm, config.learning, self.data, config.storage, config.state_path,
                               evaluation, clock, progress=self.progress, tally=self.tally,
                               role=lambda: self.roles.role.value)
        self.identity = self.learner.identity(config.swarm, config.network.wire_dtype)
        self.network = network(self.identity, self.hello)
        self.reach = Reach(config.id, config.network.address, config.swarm, config.network.relay,
                           config.network.relay_slots, clock, self.network, changed=lambda: self.membership.moved())
        self.membership = Membership(config.id, lambda: self.reach.address, config.membership, clock, hello=self.hello,
                                     profile=self.learner.profile, fingerprint_of=self.identity.fingerprint_of,
                                     network=self.network, tally=self.tally, on_join=self._peer_joined,
                                     on_lost=lambda peer: self.absences.peer_lost(peer),
                                     seed=derive_seed(config.learning.seed, config.id, "membership"))
        self.reporter = Reporter(config.id, schedule, clock, self.started, self.tally,
                                 figure(self.learner.ctx.task.metric))
        self.links = LinkQuality()
        self.roles = Roles(config.id, lambda: self.reach.address, config.roles, schedule, config.swarm, clock,
                           learner=self.learner,
                           progress=self.progress, tally=self.tally, members=self.membership, network=self.network,
                           reporter=self.reporter, defences=config.defences, links=self.links)
        self.absences = Absences(self.roles, self.membership)
        port = SchedulerPort(config.id, config.learning.seed, schedule, config.membership, clock, algorithm,
                             self.membership, self.progress, self.roles, self.network, self.tally, self.own_progress,
                             self.finish, self.stop_volunteering)
        self.scheduler: Scheduler = RoundScheduler(port) if schedule.mode == "round" else AsyncScheduler(port)
        self.requests = PeerRequests(config.id, config.swarm, schedule, config.roles, clock,
                                     membership=self.membership, roles=self.roles, scheduler=self.scheduler,
                                     progress=self.progress, learner=self.learner, tally=self.tally,
                                     reach=self.reach)
        # The state dir is locked before anything reads it, and held until the node stops: a second node started on
        # it stops with the one-line error, having read (and logged) nothing of the first's state.
        self.learner.checkpoint.lock.acquire()
        try:
            self._restore()
        except BaseException:
            self.learner.checkpoint.lock.release()
            raise

    @property
    def node_id(self) -> str:
        return self.config.id

    @property
    def address(self) -> str:
        """Where peers reach it: its own address, or its slot on its relay
        (:class:`~dfl_node.node.membership.reach.Reach`)."""
        return self.reach.address

    def _restore(self) -> None:
        """Resume from the newest checkpoint, if any: the learner's models and history, then the other parts'."""
        saved = self.learner.load()
        if saved is None:
            return
        schedule = self.config.schedule
        # finished under the settings given *now*, not those saved: a node restarted with more --rounds goes on;
        # in async mode a restarted node volunteers again
        done = schedule.mode == "round" and schedule.rounds > 0 and saved.get("round", 0) >= schedule.rounds
        self.progress.restore(saved, done)
        self.tally.restore(saved)
        limit = f" of {schedule.rounds}" if schedule.mode == "round" and schedule.rounds else ""
        log.info("%s resuming at round %d%s%s (checkpoint in %s)", self.node_id, self.progress.round, limit,
                 ", already done" if done else "", self.learner.checkpoint.directory)

    # ----- who it is, to its peers ---------------------------------------------------------
    def hello(self) -> Hello:
        """Our Hello: who we are, and where we stand. The same object while neither where we stand nor our data
        changed: every membership message carries it (a thousand a second in a thousand-node simulation), SWIM
        compares it with the last it announced, and a reply to a Hello is made from it. Its address is where peers
        reach it (:class:`~dfl_node.node.membership.reach.Reach`): a change is a new incarnation, which gossip
        spreads."""
        config, ctx, identity, said = self.config, self.learner.ctx, self.identity, self._hello
        now = (self.own_progress(), ctx.num_samples, tuple(ctx.train.input_shape), ctx.train.num_classes,
               self.roles.work_s, self.reach.address, self.reach.relay, self.reach.state == "direct")
        if said is None or (said.progress, said.num_samples, said.sample_shape, said.num_classes, said.work_s,
                            said.grpc_address, said.relay, said.direct) != now:
            progress, samples, shape, classes, work, address, relay, direct = now
            said = self._hello = Hello(
                protocol_version=PROTOCOL_VERSION, swarm=config.swarm, node_id=config.id,
                fingerprint=identity.fingerprint, algorithm=config.algorithm, boot_id=self.boot_id,
                grpc_address=address, http_port=config.api.http_port, status_url=config.api.status_url or "",
                model=identity.model, num_samples=samples, wire_dtype=identity.wire_dtype, progress=progress,
                sample_shape=shape, num_classes=classes, work_s=work, relay=relay, direct=direct,
                task="" if config.learning.task == "classification" else config.learning.task)
        return said

    def own_progress(self) -> Progress:
        """Where this node stands, as its Hello and HelloReply say it (the same object while that is unchanged)."""
        progress, role = self.progress, self.roles.role
        stamp = (progress.stamp, role, self.learner.accuracy)
        if self._progress is None or self._progress[0] != stamp:
            local, global_ = self.learner.accuracy
            said = Progress(round=progress.round, epoch=progress.epoch, holding=progress.holding, done=progress.done,
                            state=progress.token_state, busy=role is not Role.IDLE,
                            role=role_name(role, progress.holding), local_accuracy=local, global_accuracy=global_)
            self._progress = (stamp, said)
        return self._progress[1]

    # ----- its life ------------------------------------------------------------------------
    async def start(self) -> None:
        """Once it serves: the w0 point of its accuracy curve (once per state dir) and its first checkpoint."""
        await self.learner.evaluate_start()
        self.ready.set()

    async def run(self) -> None:
        """What a serving node does once started: its heartbeats, its scheduler and its look at its data, until
        cancelled (:func:`~dfl_node.service.run.run_node`, and the simulator's fleet)."""
        reaching = asyncio.ensure_future(self.reach.run(self.membership, [*self.config.membership.join,
                                                                           *self.config.membership.peers]))
        try:
            await self.reach.settled.wait()  # no Hello before it knows how peers reach it: none knows a dead address
            await asyncio.gather(self.membership.run(), self.scheduler.run(),
                                 self.data.watch(self.roles.quiesce, self._take_data), reaching)
        finally:
            reaching.cancel()

    def _take_data(self, view: DataView) -> None:
        self.learner.use_data(view.train, view.val)

    def _peer_joined(self, peer_id: str, restarted: bool) -> None:
        """A peer (re)joined: the role under way, then the scheduler, learn of it."""
        self.absences.peer_joined(peer_id, restarted)
        self.scheduler.on_join(peer_id, restarted)

    async def save(self, *, copy: bool = False) -> None:
        """Checkpoint now. ``copy``: from outside any role (the end of a run, shutdown): once none runs, a copy of
        the model, so that a role taken during the write cannot tear it."""
        if copy:
            await self.roles.quiesce()
        await self.learner.save(copy=copy)

    async def finish(self, round_: int) -> None:
        """The fleet is done at ``round_``: settle the last role, make sure there is an accuracy, checkpoint. Both
        the final announcement and a done peer's heartbeat can say so: the summary is logged once."""
        first, self._finished = not self._finished, True
        await self.roles.settled()  # the last round's aggregator may still be fusing: its model is the final one
        await self.learner.settle_evaluation(None)
        self.progress.finish(round_)  # then done: a status that says done has the final figures
        await self.save(copy=True)
        if first:
            self.reporter.summary(f"done after {round_} rounds", self.learner.accuracy)

    async def stop_volunteering(self) -> None:
        """Async mode: the time budget is over. The node still answers others' invitations; its checkpoint
        says it is done."""
        self.progress.finish(self.progress.round)
        await self.roles.quiesce()  # the last role's model, evaluated while no role changes it
        await self.learner.settle_evaluation(None)
        await self.save(copy=True)
        self.reporter.summary(f"done after {self.config.schedule.duration:.0f} s", self.learner.accuracy)

    # ----- what the REST API reads -----------------------------------------------------------
    def status(self) -> NodeStatus:
        return node_status(self)

    def history(self) -> list[HistoryEntry]:
        return self.learner.history()

    def fleet(self) -> FleetView:
        return fleet_view(self)

    async def committed_model(self) -> TrainedModel | None:
        return await self.learner.committed_model()
