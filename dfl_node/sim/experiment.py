"""``dfl-node simulate [--mode round|async]``: an experiment as K real nodes (:mod:`dfl_node.sim.fleet`) on the
in-memory network and the virtual clock, its devices and links costed by the config (:mod:`dfl_node.sim.costs`),
its faults played as scheduled (:mod:`dfl_node.sim.faults`), its compromised members playing their attacks
(:mod:`dfl_node.sim.adversaries`). Deterministic for a config and a seed."""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import fmean
from typing import Any

from dfl_node.algorithms import make_algorithm
from dfl_node.fleet_results import fleet_result
from dfl_node.learning.provision import FleetData, provision, write_fleet
from dfl_node.node.model.learner import Learner
from dfl_node.results import RunResult, inference_summary
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.settings.simulation import Adversaries, FaultSchedule
from dfl_node.sim.adversaries import adversary_nodes, poisoned_fleet
from dfl_node.sim.clock import VIRTUAL_EPOCH, run_virtual
from dfl_node.sim.costs import CostModel
from dfl_node.sim.faults import Fault, fault_figures, play_faults, stall_bound
from dfl_node.sim.fleet import VirtualFleet, plan_nodes

Progress = Callable[[int, float], None]  # (rounds the fleet reached, virtual seconds gone)
HISTORY_LIMIT = 1_000_000  # a simulated node keeps its whole history: the faults block reads it back


def round_work(config: ExperimentConfig, algorithm: str, costs: CostModel, largest_shard: int) -> float:
    """One round's own work on the slowest device and link, doubled for room: a sender's local epochs and an
    aggregator's fusion epochs over the largest shard, an evaluation of it, and a model's transfer."""
    learning = config.learning
    batches = math.ceil(largest_shard / min(learning.batch_size, learning.mkt_batch_size))
    fusion_epochs = make_algorithm(algorithm, learning, config.per_algorithm).fusion_epochs()
    steps = batches * (learning.local_epochs + fusion_epochs)
    device = max(costs.devices.values(), key=lambda d: d.step_s)
    link = max(costs.links.values(), key=lambda link: link.latency_s)
    return 2 * (steps * device.step_s + largest_shard * device.eval_sample_s + 4 * link.latency_s)


def run_fleet(config: ExperimentConfig, algorithm: str, workdir: Path | None = None, *, mode: str = "round",
              duration: float = 0.0, random_kills: int = 0, random_slowdowns: int = 0, fault_seed: int = 0,
              data: FleetData | None = None, progress: Progress | None = None, **settings: Any) -> RunResult:
    """Run ``algorithm`` on ``config``'s fleet as real nodes in ``mode`` (async: for ``duration`` virtual
    seconds), shards and state dirs under ``workdir`` (None: a temporary folder, removed after). The config's
    faults are played from the start — or, with ``random_kills``, that many kills and a partition drawn from
    ``fault_seed``, then ``random_slowdowns`` slow links and nodes
    (:meth:`~dfl_node.settings.simulation.FaultSchedule.random`, spaced by the liveness bounds); ``fault_seed`` also
    picks among the nodes a kill's role names, and the messages a lossy link loses. ``data``: the config's
    fleet data if already provisioned (several algorithms on the same data). ``progress`` is called from
    another thread, a few times a second, with the rounds the fleet reached and the virtual seconds gone.
    ``settings`` override any node setting."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dfl-sim-")))
        data = provision(config) if data is None else data
        adversaries = adversary_nodes(config)
        shards = workdir / "shards"
        write_fleet(poisoned_fleet(data, adversaries), shards)
        configs = plan_nodes(config, algorithm, shards, workdir / algorithm, mode=mode, duration=duration,
                             history_limit=HISTORY_LIMIT, **settings)
        costs = CostModel({c.id: c.network.address for c in configs}, config.simulation.devices,
                          config.simulation.links, fault_seed)
        work = round_work(config, algorithm, costs, max(len(c.train) for c in data.clients))
        node = configs[0]
        schedule = config.simulation.faults
        if random_kills or random_slowdowns:
            schedule = FaultSchedule.random(fault_seed, random_kills, peer_timeout=node.membership.peer_timeout,
                                            recovery=stall_bound(node, True, work),
                                            slow_recovery=stall_bound(node, False, work),
                                            heal_within=0.9 * node.schedule.round_timeout, slowdowns=random_slowdowns,
                                            nodes=[c.id for c in configs])
        statuses, histories, happened, ended, states, membership, learners = run_virtual(
            _run(configs, costs, schedule, fault_seed, progress, adversaries), costs.compute(), config.learning.threads)
        train_sizes = {c.node_id: len(c.train) for c in data.clients}
        result = fleet_result("simulate", statuses, histories, config, algorithm, train_sizes, VIRTUAL_EPOCH, ended)
        if config.simulation.privacy_audit:
            privacy_audit(result, learners, config)
        result.membership = membership
        result.adversaries = {node_id: str(adversary) for node_id, adversary in adversaries.items()}
        if schedule.kills or schedule.partitions or schedule.links or schedule.slow_nodes:
            result.faults = fault_figures(happened, states, node, work)
            result.faults["round_work_s"] = round(work, 3)
        if config.simulation.devices:
            result.device_classes = by_class(statuses, costs.class_of)
        return result


def privacy_audit(result: RunResult, learners: dict[str, Learner], config: ExperimentConfig) -> None:
    """``privacy_audit``: each node's final model attacked by a curious peer
    (:func:`~dfl_node.learning.membership_inference.fleet_attacks`), once the run is over and its result made: the
    attack reads the models and data the nodes hold, so the run and its figures are those of a run without it."""
    from dfl_node.learning.membership_inference import Holder, fleet_attacks  # noqa: PLC0415 - only when asked
    from dfl_node.learning.tasks import task_of  # noqa: PLC0415

    holders = [Holder(node_id, learner.ctx.model, learner.ctx.train, learner.ctx.val)
               for node_id, learner in learners.items()]
    test = next(iter(learners.values())).test if learners else None
    attacks = fleet_attacks(holders, task_of(config.learning), test, config.learning.seed)
    for node in result.nodes:
        node.membership_inference = attacks.get(node.id)
    if attacks:
        result.membership_inference = inference_summary(list(attacks.values()))


def by_class(statuses: dict[str, dict], class_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per device class: its nodes, the fusions they ran, and their mean final accuracies."""
    classes: dict[str, list[dict]] = {}
    for node_id, status in statuses.items():
        classes.setdefault(class_of[node_id], []).append(status)
    return {name: {"nodes": len(members), "fusions": sum(s["fusions"] for s in members),
                   "fusions_per_node": round(sum(s["fusions"] for s in members) / len(members), 2),
                   "global_accuracy": round(fmean(s["global_accuracy"] for s in members), 4),
                   "local_accuracy": round(fmean(s["local_accuracy"] for s in members), 4)}
            for name, members in classes.items()}


async def _run(configs: list[NodeConfig], costs: CostModel, schedule: FaultSchedule, seed: int,
               progress: Progress | None, adversaries: dict[str, Adversaries]
               ) -> tuple[dict[str, dict], dict[str, list[dict]], list[Fault], float, dict[str, dict[str, Any]],
                          dict[str, Any], dict[str, Learner]]:
    """Run the fleet to its end; what its nodes reported, the faults played, when it ended, what the nodes made
    durable, the membership's figures, and each node's learner (its final model and data) as the run left it."""
    fleet = VirtualFleet(configs, costs.transfer(), adversaries)
    with contextlib.ExitStack() as stack:
        if progress is not None:
            stack.enter_context(_reporting(fleet, progress))
        try:
            fleet.start_all()
            happened = await play_faults(fleet, costs, schedule, seed)
            await fleet.finished()
            if progress is not None:  # where the run ended, which the reporter's last look may have missed
                progress(fleet.round_reached(), asyncio.get_running_loop().time())
            ended = fleet.clock.wall()
            membership = fleet.membership.figures(asyncio.get_running_loop().time())
            statuses = {n: node.status().model_dump(mode="json") for n, node in sorted(fleet.nodes.items())}
            histories = {n: [h.model_dump(mode="json") for h in node.history()]
                         for n, node in sorted(fleet.nodes.items())}
            learners = {n: node.learner for n, node in sorted(fleet.nodes.items())}
            await fleet.stop_all()
            return statuses, histories, happened, ended, fleet.durable_states(), membership, learners
        finally:
            await fleet.close()


@contextlib.contextmanager
def _reporting(fleet: VirtualFleet, progress: Progress) -> Iterator[None]:
    """Call ``progress`` from a thread of its own every 0.2 s of *wall* time while the fleet runs: a task on the
    virtual loop would add timers to the simulation it reports on. It reads two numbers the loop writes."""
    stop, loop = threading.Event(), asyncio.get_running_loop()

    def report() -> None:
        while not stop.wait(0.2):
            progress(fleet.round_reached(), loop.time())

    reporter = threading.Thread(target=report, name="simulate-progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        stop.set()
        reporter.join()
