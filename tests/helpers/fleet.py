"""The fleet the tests share: :data:`FLEET` (4 nodes on the embedded digits data), a node of it, its run in the
simulator (:func:`simulated`, :func:`virtual_fleet`) and as real daemons on loopback (:func:`running_daemons`,
:func:`loopback_fleet`). Its provisioned shards are the ``fleet_shards`` fixture (``tests/conftest.py``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from dfl_node.peering.port import PeerHandler
from dfl_node.results import RunResult
from dfl_node.service.wiring import Daemon
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig
from dfl_node.sim import run_fleet
from dfl_node.sim.fleet import VirtualFleet, plan_nodes
from dfl_node.sim.link_profiles import LinkProfile
from dfl_node.testbed.launcher import NodeProcess, Placement, plan_fleet, stop_all

# The fleet every daemon test uses: 4 nodes on digits, quick to train, and what the simulator runs too.
FLEET = ExperimentConfig(nodes=4, partition="iid", seed=3, rounds=10, eval_every=5, batch_size=20,
                         mkt_batch_size=20, lr=0.05, hidden=[32, 32])


def fleet_node_config(**settings: object) -> NodeConfig:
    """A node of :data:`FLEET`'s fleet (its learning settings), with ``settings`` (flat keys, as flags name them)."""
    return NodeConfig.for_experiment(FLEET, **settings)


def daemon(**settings: object) -> Daemon:
    """What ``dfl-node start`` runs for :func:`fleet_node_config` of ``settings``: a node on gRPC (not started)."""
    return Daemon.build(fleet_node_config(**settings))


@contextlib.asynccontextmanager
async def virtual_fleet(config: ExperimentConfig, algorithm: str, shards: Path, state: Path, *,
                        links: LinkProfile | None = None, others: Mapping[str, PeerHandler] | None = None,
                        **settings: Any) -> AsyncIterator[VirtualFleet]:
    """``config``'s fleet as K of the daemon's own nodes on the simulator's fabric, each link costing ``links``,
    started on the running loop (run it in :func:`~dfl_node.sim.clock.run_virtual` for virtual time). ``others``:
    handlers served beside them at their addresses (a fake peer), which every node also has as a static peer;
    ``settings`` (flat keys) override every node's. On exit every node still up is killed."""
    configs = plan_nodes(config, algorithm, shards, state, **settings)
    if others:
        configs = [c.model_copy(update={"peers": [*c.membership.peers, *others]}) for c in configs]
    fleet = VirtualFleet(configs, None if links is None else lambda src, dst: links)
    try:
        for address, handler in (others or {}).items():
            fleet.fabric.serve(address, handler)
        fleet.start_all()
        yield fleet
    finally:
        await fleet.close()


def simulated(config: ExperimentConfig, algorithm: str, workdir: Path) -> tuple[RunResult, dict[str, dict]]:
    """``dfl-node simulate``'s run of ``algorithm`` (K real nodes on the virtual clock), and each node's final
    checkpoint — its model with the algorithm's extra models (DFML's peak, FML's meme) and scalars."""
    result = run_fleet(config, algorithm, workdir)
    return result, {n.id: load_file(str(workdir / algorithm / n.id / "model.safetensors")) for n in result.nodes}


# ----------------------------------------------------------------------------- real daemons


@contextlib.contextmanager
def running_daemons(nodes: list[NodeProcess], *, per_node: Callable[[str], dict[str, object]] | None = None,
                    stop_grace: float | None = None, log_lines: int = 15) -> Iterator[list[NodeProcess]]:
    """Start ``nodes`` (with ``per_node(id)``'s settings as ``DFL_*`` variables, if given); on exit stop them
    and print each one's log tail, which pytest shows for a failing test.

    ``stop_grace`` None: each daemon in turn gets SIGTERM and 10 s before SIGKILL; a number: all are
    signalled at once and reaped against one deadline that far away (:func:`stop_all`)."""
    try:
        for node in nodes:
            if per_node is not None:
                node.env.update({f"DFL_{k.upper()}": str(v) for k, v in per_node(node.id).items()})
            node.start()
        yield nodes
    finally:
        if stop_grace is None:
            for node in nodes:
                node.stop()
        else:
            stop_all(nodes, grace=stop_grace)
        for node in nodes:
            print(f"--- {node.id} log tail ---\n" + "\n".join(node.log_path.read_text().splitlines()[-log_lines:]))


@contextlib.contextmanager
def loopback_fleet(shards: Path, workdir: Path, algorithm: str, config: ExperimentConfig = FLEET, *,
                   mode: str = "round", mdns: bool = True, static_peers: bool = False, extra: dict | None = None,
                   swarm: str = "t", per_node: Callable[[str], dict[str, object]] | None = None,
                   stop_grace: float | None = None, log_lines: int = 15) -> Iterator[list[NodeProcess]]:
    """``config.nodes`` daemons of ``algorithm`` on 127.0.0.1 in a swarm of their own (``swarm``-random),
    planned by :func:`plan_fleet` (``mode``, ``mdns``, ``static_peers``, ``extra``: its own) and run by
    :func:`running_daemons`."""
    nodes = plan_fleet(config, algorithm, shards, workdir, [Placement("127.0.0.1")] * config.nodes,
                       swarm=f"{swarm}-{uuid.uuid4().hex[:8]}", mode=mode, mdns=mdns, static_peers=static_peers,
                       extra=extra)
    with running_daemons(nodes, per_node=per_node, stop_grace=stop_grace, log_lines=log_lines):
        yield nodes
