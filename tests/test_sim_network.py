"""Real :class:`Node` objects on the in-memory peer network and a virtual clock, in one process (issue 19).

The nodes are the daemon's own (round scheduler, roles, collector, checkpoints), with static peers and no mDNS;
only their two ports differ: :class:`~dfl_node.sim.network.MemoryFabric` instead of gRPC, and a
:class:`~dfl_node.sim.clock.VirtualTimeLoop` under a :class:`~dfl_node.sim.clock.VirtualClock`. So a token
timeout of virtual seconds costs next to no wall time, and the result is the simulator's, bit for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from dfl_node.learning.devices import torch_threads
from dfl_node.learning.fleet import provision
from dfl_node.node.config import NodeConfig
from dfl_node.node.daemon import Node
from dfl_node.sim import Simulation
from dfl_node.sim.clock import CostFn, VirtualClock, VirtualTimeLoop
from dfl_node.sim.network import LinkProfile, MemoryFabric
from tests.conftest import FLEET

T = TypeVar("T")
ROUNDS = 3


def run_virtual(main: Coroutine[Any, Any, T], cost: CostFn | None = None) -> T:
    """Run ``main`` on a virtual-time loop (``to_thread`` work charged by ``cost``), with torch's threads as
    a daemon sets them for its process (``serve``) and the simulator for its run: the work runs inline on
    this thread, and the number of threads decides a float sum's order. Left at torch's default (one per
    core), nodes 0 and 1 of the Def-KT fleet end with other bits than the simulator's (which runs with
    ``threads``: 1) — under pytest, or in a script unless a Simulation ran first and left its setting."""
    loop = VirtualTimeLoop(cost)
    try:
        with torch_threads(FLEET.threads):
            return loop.run_until_complete(main)
    finally:
        loop.close()


@dataclass
class SimNode:
    """A node on the fabric, and the tasks ``run_node`` would have started for it (heartbeats, scheduler)."""

    node: Node
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def kill(self, fabric: MemoryFabric) -> None:
        """kill -9: the node's tasks are cancelled and its address stops answering."""
        fabric.kill(self.node.grpc_address)
        scheduler = self.node.scheduler
        extra = [t for t in (getattr(scheduler, "_holding", None), self.node._settling) if t is not None]
        for task in [*self.tasks, *extra]:
            task.cancel()


@contextlib.asynccontextmanager
async def sim_fleet(shards: Path, state: Path, rounds: int, algorithm: str = "defkt", *,
                    profile: LinkProfile | None = None, **settings: object) -> AsyncIterator[
        tuple[MemoryFabric, list[SimNode]]]:
    """The test fleet as K real nodes on one fabric (every link costs ``profile``), with their tasks started;
    ``settings`` override the nodes' config. On exit every node is killed and its tasks awaited."""
    fabric = MemoryFabric(None if profile is None else (lambda src, dst: profile))
    ids = [f"node-{i}" for i in range(FLEET.nodes)]
    addresses = {node_id: f"127.0.0.1:{50100 + i}" for i, node_id in enumerate(ids)}
    nodes = []
    for node_id in ids:
        config = NodeConfig(**{**FLEET.model_dump(include=set(NodeConfig.model_fields)), "id": node_id,
                               "data": shards / node_id, "algorithm": algorithm, "http_port": 0, "mdns": False,
                               "state_dir": state / node_id, "evaluate": False, "rounds": rounds,
                               "grpc_port": 50100 + ids.index(node_id), "min_peers": len(ids) - 1,
                               "peers": [a for i, a in addresses.items() if i != node_id], **settings})
        node = Node(config, network=fabric.endpoint(addresses[node_id], connect_timeout=config.connect_timeout),
                    clock=VirtualClock())
        assert node.grpc_address == addresses[node_id]
        fabric.serve(node.grpc_address, node.requests)
        node.handshake.starting = False
        nodes.append(SimNode(node))
    loop = asyncio.get_running_loop()
    for sim in nodes:
        sim.tasks = [loop.create_task(sim.node.peers.run()), loop.create_task(sim.node.scheduler.run())]
    try:
        yield fabric, nodes
    finally:
        for sim in nodes:
            sim.kill(fabric)
        await asyncio.gather(*(t for sim in nodes for t in sim.tasks), return_exceptions=True)
        for sim in nodes:
            sim.node.checkpoint.lock.release()


async def finished(nodes: list[SimNode]) -> None:
    await asyncio.gather(*(s.node.scheduler.finished.wait() for s in nodes))  # type: ignore[union-attr]


# Each compute call (training, a fusion, a check, a checkpoint) costs this much virtual time, and each message
# this much latency: the fleet's timeline moves, and its schedule must still not change what it computes.
COMPUTE_S, LATENCY_S = 0.5, 0.01


@pytest.mark.parametrize("algorithm", ["defkt", "fairavg", "fedavg"])  # a pair, a pull, a group algorithm
def test_rounds_on_the_memory_network_equal_the_simulator_bit_for_bit(algorithm: str, fleet_shards: Path,
                                                                      tmp_path: Path) -> None:
    async def main() -> tuple[dict[str, dict[str, torch.Tensor]], float]:
        async with sim_fleet(fleet_shards, tmp_path, ROUNDS, algorithm, profile=LinkProfile(LATENCY_S)) as (_, nodes):
            await asyncio.wait_for(finished(nodes), 600)
            return ({s.node.node_id: s.node.ctx.snapshot() for s in nodes}, asyncio.get_running_loop().time())

    states, virtual = run_virtual(main(), cost=lambda fn: COMPUTE_S)
    config = FLEET.model_copy(update={"rounds": ROUNDS})
    simulation = Simulation(config, algorithm, provision(config))
    simulation.run()
    assert states.keys() == simulation.nodes.keys()
    for node_id, ctx in simulation.nodes.items():
        expected, got = ctx.checkpoint_state(), states[node_id]
        assert got.keys() == expected.keys(), node_id
        differ = [name for name, tensor in expected.items() if not torch.equal(got[name], tensor)]
        assert not differ, f"{node_id}: {differ} differ from the simulator's"
    assert virtual >= ROUNDS * COMPUTE_S  # the clock moved: at least one compute call per round


@pytest.mark.skip(reason="issue 19 spike: does not finish yet (ran past 240 s of wall time); bound it in virtual "
                         "time and find which wait never ends before enabling")
def test_a_killed_holder_s_token_is_regenerated_after_token_timeout_of_virtual_time(fleet_shards: Path,
                                                                                    tmp_path: Path) -> None:
    token_timeout = 30.0

    async def main() -> tuple[float, int, int]:
        loop = asyncio.get_running_loop()
        async with sim_fleet(fleet_shards, tmp_path, 50, token_timeout=token_timeout) as (fabric, nodes):
            while not any(s.node.state.holding and s.node.state.round >= 1 for s in nodes):
                await asyncio.sleep(0.01)
            holder = next(s for s in nodes if s.node.state.holding)
            round_at_kill = holder.node.state.round
            holder.kill(fabric)
            killed_at = loop.time()
            others = [s for s in nodes if s is not holder]
            while not any(s.node.state.epoch >= 2 for s in others):
                await asyncio.sleep(0.1)
            regenerated_after = loop.time() - killed_at
            while not any(s.node.state.round > round_at_kill + 1 for s in others):  # and the fleet goes on
                await asyncio.sleep(0.1)
            return regenerated_after, round_at_kill, max(s.node.state.round for s in others)

    wall = time.perf_counter()
    regenerated_after, round_at_kill, round_after = run_virtual(main())
    wall = time.perf_counter() - wall
    assert regenerated_after >= token_timeout  # virtual seconds of silence before anyone regenerates it
    assert round_after > round_at_kill + 1
    assert wall < regenerated_after / 2, f"{wall:.1f} s of wall time for {regenerated_after:.0f} virtual seconds"
