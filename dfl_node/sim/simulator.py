"""The in-process driver: K virtual nodes run an algorithm round by round, messages handed over in memory.

It calls exactly the algorithm methods the daemon calls (plan → sender_step → receiver_step →
sender_finish), so what it measures is what a fleet does — without sockets.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from dfl_node.algorithms import NodeContext, make_algorithm
from dfl_node.config import ExperimentConfig
from dfl_node.learning.fleet import Fleet
from dfl_node.learning.models import build_model, param_digest
from dfl_node.learning.training import evaluate
from dfl_node.results import EvalRecord, NodeResult, RunResult

ProgressCallback = Callable[[int, EvalRecord | None], None]


def initial_model(config: ExperimentConfig, fleet: Fleet) -> torch.nn.Module:
    """w0: the same architecture and parameters on every client (000 Alg. 1, Initialization)."""
    return build_model(config.model, fleet.input_shape, fleet.num_classes, hidden=config.hidden, seed=config.seed)


class Simulation:
    def __init__(self, config: ExperimentConfig, algorithm: str, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.algorithm = make_algorithm(algorithm, config)
        w0 = initial_model(config, fleet)
        self.nodes = {
            c.node_id: NodeContext(c.node_id, copy.deepcopy(w0), c.train, c.val, config) for c in fleet.clients
        }
        self.bytes_transmitted = 0
        self.models_transmitted = 0
        self.sent = dict.fromkeys(self.nodes, 0)
        self.received = dict.fromkeys(self.nodes, 0)

    def run_round(self, round_: int) -> None:
        plan = self.algorithm.plan_round(round_, list(self.nodes))
        for pairing in plan.pairings:
            sender, receiver = self.nodes[pairing.sender], self.nodes[pairing.receiver]
            message = self.algorithm.sender_step(sender, round_)
            reply = self.algorithm.receiver_step(receiver, message)
            self.algorithm.sender_finish(sender, reply)
            self.sent[sender.node_id] += 1
            self.received[receiver.node_id] += 1
            self.bytes_transmitted += message.nbytes + (reply.nbytes if reply else 0)
            self.models_transmitted += 1

    def evaluate(self, round_: int, started: float) -> EvalRecord:
        glob = {nid: evaluate(ctx.model, self.fleet.test).accuracy for nid, ctx in self.nodes.items()}
        loc = {nid: evaluate(ctx.model, ctx.val).accuracy for nid, ctx in self.nodes.items()}
        return EvalRecord(
            round=round_, global_accuracy=sum(glob.values()) / len(glob), local_accuracy=sum(loc.values()) / len(loc),
            per_node_global=glob, per_node_local=loc, bytes_transmitted=self.bytes_transmitted,
            wall_time_s=time.perf_counter() - started,
        )

    def run(self, progress: ProgressCallback | None = None) -> RunResult:
        torch.set_num_threads(self.config.threads)
        started = time.perf_counter()
        history = [self.evaluate(0, started)]
        for t in range(self.config.rounds):
            self.run_round(t)
            done = t + 1
            record = None
            if done % self.config.eval_every == 0 or done == self.config.rounds:
                record = self.evaluate(done, started)
                history.append(record)
            if progress:
                progress(done, record)
        last = history[-1]
        nodes = [
            NodeResult(
                id=nid, global_accuracy=last.per_node_global[nid], local_accuracy=last.per_node_local[nid],
                param_sha256=param_digest(ctx.model.state_dict()), num_train=ctx.num_samples,
                models_sent=self.sent[nid], models_received=self.received[nid],
            )
            for nid, ctx in self.nodes.items()
        ]
        return RunResult(
            driver="simulate", algorithm=self.algorithm.name, config=self.config.model_dump(mode="json"),
            rounds=self.config.rounds, history=history, nodes=nodes, bytes_transmitted=self.bytes_transmitted,
            models_transmitted=self.models_transmitted, wall_time_s=time.perf_counter() - started,
        )
