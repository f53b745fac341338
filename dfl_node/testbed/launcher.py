"""A fleet of real ``dfl-node start`` processes on one machine, watched over REST and torn down.

The experiment config becomes each node's ``DFL_*`` environment — the same variables
``deploy/node.env``, compose and Kubernetes use — so the testbed invents no flags of its own.
Results are collected into the simulator's :class:`~dfl_node.results.RunResult` schema, so a
testbed run and a simulation of the same config can be compared directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dfl_node.addresses import is_loopback
from dfl_node.fleet_results import fleet_result
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.learning.provision import TEST_FILE, FleetData, architectures, fleet_ids
from dfl_node.results import RunResult
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.testbed.fetch import fetch_all
from dfl_node.testbed.namespaces import inside, run_inside

_HANDED_OUT: set[int] = set()  # ports free_port gave this process: never twice (the kernel may offer one again)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now, and one this process has not been given before: a fleet's ports are
    picked before its nodes bind them, so the kernel could otherwise hand two nodes the same one."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


GRPC_PORT = 50051  # where a node of its own address (a namespace) serves its peers


@dataclass
class Placement:
    """Where a node runs: the address it serves on, and the network namespace it runs in (none: this one)."""

    host: str
    namespace: str | None = None
    join: list[str] = field(default_factory=list)  # its --join addresses (a multi-site testbed's)


@dataclass
class NodeProcess:
    id: str
    host: str
    grpc_port: int
    http_port: int
    state_dir: Path
    log_path: Path
    env: dict[str, str]
    namespace: str | None = None  # the network namespace it runs in (:mod:`dfl_node.testbed.namespaces`)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> None:
        argv = inside(self.namespace, [sys.executable, "-m", "dfl_node", "start"])
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Ask the daemon to stop (it checkpoints and leaves the swarm on SIGTERM); a no-op once it has exited."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def reap(self, deadline: float) -> None:
        """Wait for the daemon until ``deadline`` (time.monotonic), then SIGKILL it: it never outlives us."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """One daemon: ``sig``, then SIGKILL after ``timeout`` (a fleet: :func:`stop_all`)."""
        self.terminate(sig)
        self.reap(time.monotonic() + timeout)


def stop_all(nodes: list[NodeProcess], grace: float = 10.0) -> None:
    """Signal every daemon first, then reap them against one deadline: teardown takes one grace, not N."""
    for node in nodes:
        node.terminate()
    deadline = time.monotonic() + grace
    for node in nodes:
        node.reap(deadline)


def node_env(learning: SharedSettings, options: AlgorithmOptions, **settings: object) -> dict[str, str]:
    """``DFL_*`` variables for a node: how the experiment's nodes learn (``learning``) and each algorithm's own
    settings (``options``), plus node settings."""
    values = {**learning.model_dump(), **options.model_dump(), **settings}
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
    joins = {}
    for node_id, place in zip(fleet_ids(config.nodes), placements):
        shared_host = is_loopback(place.host)  # every node on one address: each needs ports of its own
        joins[node_id] = place.join
        grpc_port = free_port() if shared_host else GRPC_PORT
        http_port = free_port() if shared_host else 8080
        nodes.append(NodeProcess(node_id, place.host, grpc_port, http_port, workdir / "state" / node_id,
                                 workdir / f"{node_id}.log", {}, place.namespace))
    specs = architectures(config.architectures, config.learning, config.nodes)  # each its own (a mixed fleet)
    for node in nodes:
        peers = [f"{n.host}:{n.grpc_port}" for n in nodes if n is not node] if static_peers else []
        spec = specs[node.id]
        settings = dict(
            id=node.id, model=spec.name, hidden=list(spec.widths or ()),
            data=shards / node.id, test_data=shards / TEST_FILE, algorithm=algorithm, mode=mode,
            host=node.host, grpc_port=node.grpc_port, http_port=node.http_port, swarm=swarm, mdns=mdns, peers=peers,
            join=joins[node.id],
            state_dir=node.state_dir, min_peers=len(nodes) - 1, rounds=config.rounds, eval_every=config.eval_every,
            wire_dtype=config.wire_dtype,
            # REST on the address the node serves on: the driver polls node.url, from another namespace with --netns
            http_host=node.host,
            # off loopback (--netns) the nodes serve a bridge inside this machine that only the testbed's namespaces
            # reach: a private network, where running without credentials is a choice made here, explicitly
            insecure=not is_loopback(node.host),
        )
        # ``extra`` wins: tests tune any setting
        node.env = node_env(config.learning, config.per_algorithm, **{**settings, **(extra or {})})
    return nodes


def fetch_json(nodes: list[NodeProcess], path: str, timeout: float = 2.0) -> dict[str, object]:
    """GET ``path`` from every node's REST API (None where it does not answer), from inside its own namespace if it
    has one (a node behind a testbed's NAT serves where no other namespace reaches), the namespaces side by side."""
    spaces: dict[str | None, list[NodeProcess]] = {}
    for node in nodes:
        spaces.setdefault(node.namespace, []).append(node)
    with ThreadPoolExecutor(max_workers=min(16, len(spaces))) as pool:
        answers = pool.map(lambda group: run_inside(group[0].namespace, fetch_all, [f"{n.url}{path}" for n in group],
                                                    timeout), spaces.values())
        values = {n.id: v for group, got in zip(spaces.values(), answers) for n, v in zip(group, got)}
    return {n.id: values[n.id] for n in nodes}


def poll_status(nodes: list[NodeProcess], timeout: float = 2.0) -> dict[str, dict | None]:
    return fetch_json(nodes, "/status", timeout)  # type: ignore[return-value]


def node_line(node_id: str, status: dict | None) -> str:
    """One short line for an operator: where a node stands, never its whole status."""
    if status is None:
        return f"{node_id}: not answering"
    alive = sum(p["alive"] for p in status["peers"])
    line = f"{node_id}: round {status['round']}, role {status['role']}, {alive} peer(s) alive"
    return line + (", done" if status["done"] else "")


def stuck_report(statuses: dict[str, dict | None], limit: int = 10) -> str:
    """The nodes that are not done (all nodes if every one is), one line each, at most ``limit`` lines."""
    pending = {i: s for i, s in statuses.items() if s is None or not s["done"]} or statuses
    lines = [node_line(i, s) for i, s in list(pending.items())[:limit]]
    if len(pending) > limit:
        lines.append(f"… and {len(pending) - limit} more")
    return "\n".join(f"  {line}" for line in lines)


def wait_until(nodes: list[NodeProcess], predicate: Callable[[dict[str, dict | None]], bool], timeout: float,
               on_poll: Callable[[dict[str, dict | None]], None] | None = None, every: float = 0.5) -> dict:
    """Poll every node's /status until ``predicate`` holds; raises TimeoutError (or RuntimeError if a node died).

    The errors are short enough to show a user as they are: a line per node that is not done.
    """
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
            raise TimeoutError(f"fleet did not get there in {timeout:.0f} s:\n{stuck_report(statuses)}")
        time.sleep(every)


def all_done(statuses: dict[str, dict | None]) -> bool:
    return all(s is not None and s["done"] for s in statuses.values())


def done_twice() -> Callable[[dict[str, dict | None]], bool]:
    """A :func:`wait_until` predicate: :func:`all_done` in two polls in a row, so the counters are final.

    A poll reads the nodes one after the other, not at one instant: a receiver read just before a
    sender's last push looks done (idle) although that fusion is still to come, and the sender, read
    after it, is done too. A push is admitted before its sender is done, so in the next poll that
    receiver is either still busy (not done) or finished, with its fusion counted.
    """
    previous = False

    def check(statuses: dict[str, dict | None]) -> bool:
        nonlocal previous
        now = all_done(statuses)
        settled, previous = previous and now, now
        return settled

    return check


def collect(nodes: list[NodeProcess], config: ExperimentConfig, algorithm: str, fleet: FleetData, started: float
            ) -> RunResult:
    """The fleet's final state in the simulator's schema, as it happened; ``started``: unix time of the launch."""
    polled = poll_status(nodes)
    histories: dict = fetch_json(nodes, "/history", timeout=5.0)
    silent = [n.id for n in nodes if polled[n.id] is None or histories[n.id] is None]
    if silent:
        raise RuntimeError(f"node(s) {', '.join(silent)} stopped answering before their results were collected")
    statuses = {node_id: status for node_id, status in polled.items() if status is not None}  # all of them
    train_sizes = {c.node_id: len(c.train) for c in fleet.clients}
    return fleet_result("testbed", statuses, histories, config, algorithm, train_sizes, started, time.time())
