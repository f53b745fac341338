"""A fleet of real ``dfl-node start`` processes on one machine, watched over REST and torn down.

The experiment config becomes each node's ``DFL_*`` environment — the same variables
``deploy/node.env``, compose and Kubernetes use — so the testbed invents no flags of its own.
Results are collected into the simulator's :class:`~dfl_node.results.RunResult` schema, so a
testbed run and a simulation of the same config can be compared directly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dfl_node.config import ExperimentConfig, LearningConfig
from dfl_node.learning.fleet import TEST_FILE, Fleet, fleet_ids
from dfl_node.results import EvalRecord, NodeResult, RunResult
from dfl_node.testbed.fetch import fetch_all

Wrap = Callable[[list[str]], list[str]]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Placement:
    """Where a node runs: the address it serves on and how its command is wrapped (e.g. ``ip netns exec``)."""

    host: str
    wrap: Wrap = field(default=lambda argv: argv)


@dataclass
class NodeProcess:
    id: str
    host: str
    grpc_port: int
    http_port: int
    state_dir: Path
    log_path: Path
    env: dict[str, str]
    wrap: Wrap
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> None:
        argv = self.wrap([sys.executable, "-m", "dfl_node", "start"])
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def node_env(config: LearningConfig, **settings: object) -> dict[str, str]:
    """``DFL_*`` variables for a node: the learning settings of the experiment plus node settings."""
    values = {**config.model_dump(include=set(LearningConfig.model_fields)), **settings}
    env = {}
    for key, value in values.items():
        if value is None:
            continue
        env[f"DFL_{key.upper()}"] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return env


def plan_fleet(
    config: ExperimentConfig, algorithm: str, shards: Path, workdir: Path, placements: list[Placement], *,
    swarm: str, mode: str = "round", mdns: bool = True, static_peers: bool = False, extra: dict | None = None,
) -> list[NodeProcess]:
    nodes = []
    for node_id, place in zip(fleet_ids(config.nodes), placements):
        grpc_port = free_port() if place.host.startswith("127.") else 50051
        http_port = free_port() if place.host.startswith("127.") else 8080
        nodes.append(NodeProcess(node_id, place.host, grpc_port, http_port, workdir / "state" / node_id,
                                 workdir / f"{node_id}.log", {}, place.wrap))
    for node in nodes:
        peers = [f"{n.host}:{n.grpc_port}" for n in nodes if n is not node] if static_peers else []
        node.env = node_env(
            config, id=node.id, data=shards / node.id, test_data=shards / TEST_FILE, algorithm=algorithm, mode=mode,
            host=node.host, grpc_port=node.grpc_port, http_port=node.http_port, swarm=swarm, mdns=mdns, peers=peers,
            state_dir=node.state_dir, min_peers=len(nodes) - 1, rounds=config.rounds, **(extra or {}),
        )
    return nodes


def fetch_json(nodes: list[NodeProcess], path: str, timeout: float = 2.0) -> dict[str, object]:
    """GET ``path`` from every node's REST API (None where it does not answer), through its namespace if any."""
    urls = [f"{n.url}{path}" for n in nodes]
    argv = nodes[0].wrap([sys.executable, "-m", "dfl_node.testbed.fetch", str(timeout), *urls])
    if argv[0] == sys.executable:  # loopback: no helper process needed
        values = fetch_all(urls, timeout)
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout * len(urls) + 30)
        values = json.loads(done.stdout) if done.returncode == 0 else [None] * len(urls)
    return dict(zip((n.id for n in nodes), values))


def poll_status(nodes: list[NodeProcess], timeout: float = 2.0) -> dict[str, dict | None]:
    return fetch_json(nodes, "/status", timeout)  # type: ignore[return-value]


def wait_until(nodes: list[NodeProcess], predicate: Callable[[dict[str, dict | None]], bool], timeout: float,
               on_poll: Callable[[dict[str, dict | None]], None] | None = None, every: float = 0.5) -> dict:
    """Poll every node's /status until ``predicate`` holds; raises TimeoutError (or RuntimeError if a node died)."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = poll_status(nodes)
        if on_poll:
            on_poll(statuses)
        if predicate(statuses):
            return statuses
        dead = [n.id for n in nodes if n.process is not None and n.process.poll() is not None]
        if dead:
            raise RuntimeError(f"node(s) {', '.join(dead)} exited; see their logs in {nodes[0].log_path.parent}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleet did not get there in {timeout:.0f} s: {statuses}")
        time.sleep(every)


def all_done(statuses: dict[str, dict | None]) -> bool:
    return all(s is not None and s["done"] for s in statuses.values())


def collect(nodes: list[NodeProcess], config: ExperimentConfig, algorithm: str, fleet: Fleet, wall: float) -> RunResult:
    """The fleet's final state in the simulator's schema; the curve is rebuilt from each node's history."""
    statuses = poll_status(nodes)
    histories: dict = fetch_json(nodes, "/history", timeout=5.0)
    train_sizes = {c.node_id: len(c.train) for c in fleet.clients}
    results = [
        NodeResult(id=n.id, global_accuracy=statuses[n.id]["global_accuracy"], local_accuracy=statuses[n.id]["local_accuracy"],
                   param_sha256=statuses[n.id]["param_sha256"], num_train=train_sizes[n.id],
                   models_sent=statuses[n.id]["models_sent"], models_received=statuses[n.id]["models_received"])
        for n in nodes
    ]
    history = []
    eval_rounds = sorted({*range(config.eval_every, config.rounds + 1, config.eval_every), config.rounds})
    for r in eval_rounds:
        per_global, per_local = {}, {}
        for n in nodes:
            known = [h for h in histories[n.id] if h["round"] <= r and h["global_accuracy"] is not None]
            if known:
                per_global[n.id], per_local[n.id] = known[-1]["global_accuracy"], known[-1]["local_accuracy"]
        if len(per_global) == len(nodes):
            history.append(EvalRecord(round=r, global_accuracy=sum(per_global.values()) / len(nodes),
                                      local_accuracy=sum(per_local.values()) / len(nodes), per_node_global=per_global,
                                      per_node_local=per_local, bytes_transmitted=0, wall_time_s=wall))
    return RunResult(
        driver="testbed", algorithm=algorithm, config=config.model_dump(mode="json"), rounds=config.rounds,
        history=history, nodes=results, bytes_transmitted=sum(s["bytes_sent"] for s in statuses.values()),
        models_transmitted=sum(s["models_sent"] for s in statuses.values()), wall_time_s=wall,
    )
