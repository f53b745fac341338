"""The in-process driver: K virtual nodes play every round's groups, messages handed over in memory.

It plays exactly the role sequence the daemon plays (:mod:`dfl_node.algorithms.runner`), over
:class:`InMemoryTransport` instead of gRPC, so what it measures is what a fleet does — without
sockets. Each node runs the architecture the config assigns it (:func:`~dfl_node.learning.fleet.architectures`).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from dfl_node.algorithms import NodeContext, make_algorithm
from dfl_node.algorithms.base import equip
from dfl_node.algorithms.plan import RoundPlan, Step
from dfl_node.algorithms.runner import play_aggregator, play_sender
from dfl_node.config import ExperimentConfig
from dfl_node.learning.devices import resolve_device, torch_threads
from dfl_node.learning.evaluation import evaluate_many
from dfl_node.learning.fleet import Fleet, architectures
from dfl_node.learning.models import param_digest
from dfl_node.learning.training import evaluate
from dfl_node.results import EvalRecord, NodeResult, RunResult, SeriesRecord
from dfl_node.sim.transport import InMemoryTransport

ProgressCallback = Callable[[int, EvalRecord | None], None]


def initial_models(config: ExperimentConfig, fleet: Fleet) -> dict[str, torch.nn.Module]:
    """w0 of every client: one per architecture, from the config's seed, so identical architectures
    start identical (000 Alg. 1, 003 Alg. 2 "Initialization"). Built on the CPU, as a daemon builds its
    own, whatever the device: the seed draws the same values there."""
    specs = architectures(config)
    built = {str(spec): spec.build(fleet.input_shape, fleet.num_classes, seed=config.seed)
             for spec in dict.fromkeys(specs.values())}
    return {node_id: copy.deepcopy(built[str(spec)]) for node_id, spec in specs.items()}


class Simulation:
    def __init__(self, config: ExperimentConfig, algorithm: str, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.algorithm = make_algorithm(algorithm, config)
        self.device = resolve_device(config.device)  # models and data move there once, here
        specs, w0 = architectures(config), initial_models(config, fleet)
        self.nodes = {c.node_id: NodeContext(c.node_id, w0[c.node_id].to(self.device), specs[c.node_id],
                                             c.train.to(self.device), c.val.to(self.device), config)
                      for c in fleet.clients}
        self.test = fleet.test.to(self.device)
        for ctx in self.nodes.values():
            equip(self.algorithm, ctx, config.seed)  # the algorithm's extra models (DFML's peak, FML's meme)
        self.transport = InMemoryTransport(self.algorithm, self.nodes, config.wire_dtype)
        self.state: dict[str, str] = {}  # the algorithm state a round token would carry

    def plan(self, round_: int) -> RoundPlan:
        plan = self.algorithm.plan_round(round_, [ctx.profile() for ctx in self.nodes.values()], self.state)
        self.state = dict(plan.state)
        return plan

    async def play_round(self, round_: int) -> None:
        plan = self.plan(round_)
        roles: list[Coroutine[Any, Any, object]] = []
        for group in plan:
            step = Step(round_, group, plan.state)
            if not group.open:  # an open group's aggregator is started by its sender's choice (bind)
                roles.append(play_aggregator(self.algorithm, self.nodes[group.aggregator], step, self.transport))
            if not group.pull:
                roles += [play_sender(self.algorithm, self.nodes[s], step, self.transport) for s in group.senders]
        await asyncio.gather(*roles)
        started, self.transport.started = self.transport.started, []
        await asyncio.gather(*started)

    def run_round(self, round_: int) -> None:
        asyncio.run(self.play_round(round_))

    def evaluate(self, round_: int, started: float) -> EvalRecord:
        """Every node's model on the global test set — all at once, batched (``evaluate_many``: equal to one
        at a time but where a sample's top two logits tie within rounding, one sample) — and on its own
        validation split. The models are those the algorithm reports (its first is the node's; DFML: the peak
        model), the others go into ``series``."""
        reported = {nid: self.algorithm.reported_models(ctx) for nid, ctx in self.nodes.items()}
        series = {}
        for name in next(iter(reported.values())):
            models = {nid: r[name] for nid, r in reported.items()}
            tested = evaluate_many(list(models.values()), self.test)
            glob = {nid: result.accuracy for nid, result in zip(models, tested)}
            loc = {nid: evaluate(model, self.nodes[nid].val).accuracy for nid, model in models.items()}
            series[name] = SeriesRecord(global_accuracy=sum(glob.values()) / len(glob), per_node_global=glob,
                                        local_accuracy=sum(loc.values()) / len(loc), per_node_local=loc)
        first, *others = series
        return EvalRecord(
            round=round_, **series[first].model_dump(), bytes_transmitted=self.transport.bytes_transmitted,
            wall_time_s=time.perf_counter() - started, series={name: series[name] for name in others},
        )

    def run(self, progress: ProgressCallback | None = None) -> RunResult:
        with torch_threads(self.config.threads):  # as a daemon sets them; the caller's are put back after
            return asyncio.run(self._run(progress))

    async def _run(self, progress: ProgressCallback | None) -> RunResult:
        started = time.perf_counter()
        history = [self.evaluate(0, started)]
        for t in range(self.config.rounds):
            await self.play_round(t)
            done = t + 1
            record = None
            if done % self.config.eval_every == 0 or done == self.config.rounds:
                record = self.evaluate(done, started)
                history.append(record)
            if progress:
                progress(done, record)
        last, transport = history[-1], self.transport
        nodes = [
            NodeResult(
                id=nid, global_accuracy=last.per_node_global[nid], local_accuracy=last.per_node_local[nid],
                param_sha256=param_digest(ctx.model.state_dict()), num_train=ctx.num_samples,
                models_sent=transport.sent[nid], models_received=transport.received[nid], model=str(ctx.spec),
            )
            for nid, ctx in self.nodes.items()
        ]
        return RunResult(
            driver="simulate", algorithm=self.algorithm.name, config=self.config.model_dump(mode="json"),
            rounds=self.config.rounds, history=history, nodes=nodes, bytes_transmitted=transport.bytes_transmitted,
            models_transmitted=transport.models_transmitted, wall_time_s=time.perf_counter() - started,
        )
