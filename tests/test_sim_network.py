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

from dfl_node.learning.fleet import provision
from dfl_node.learning.models import param_digest
from dfl_node.node.config import NodeConfig
from dfl_node.node.daemon import Node
from dfl_node.sim import Simulation
from dfl_node.sim.clock import VirtualClock, VirtualTimeLoop
from dfl_node.sim.network import MemoryFabric
from tests.conftest import FLEET

T = TypeVar("T")
ROUNDS = 3


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a virtual-time loop; torch's threads as a daemon (and the simulator) set them: the
    work runs inline on this thread, and the number of threads changes a float sum's order."""
    torch.set_num_threads(FLEET.threads)
    loop = VirtualTimeLoop()
    try:
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
async def sim_fleet(shards: Path, state: Path, rounds: int, **settings: object) -> AsyncIterator[
        tuple[MemoryFabric, list[SimNode]]]:
    fabric = MemoryFabric()
    ids = [f"node-{i}" for i in range(FLEET.nodes)]
    addresses = {node_id: f"127.0.0.1:{50100 + i}" for i, node_id in enumerate(ids)}
    nodes = []
    for node_id in ids:
        config = NodeConfig(**{**FLEET.model_dump(include=set(NodeConfig.model_fields)), "id": node_id,
                               "data": shards / node_id, "algorithm": "defkt", "http_port": 0, "mdns": False,
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


@pytest.mark.xfail(strict=False, reason="issue 19 spike: the run and its role sequence equal the simulator's (same "
                   "plans, same counters) and the digests match when this code runs from a script (python or pytest "
                   "collecting a module), but under this test function nodes 0 and 1 differ; not yet explained")
def test_defkt_rounds_on_the_memory_network_equal_the_simulator(fleet_shards: Path, tmp_path: Path) -> None:
    async def main() -> tuple[dict[str, str], float]:
        async with sim_fleet(fleet_shards, tmp_path, ROUNDS) as (_, nodes):
            await asyncio.wait_for(finished(nodes), 600)
            return ({s.node.node_id: param_digest(s.node.ctx.model.state_dict()) for s in nodes},
                    asyncio.get_running_loop().time())

    digests, virtual = run_virtual(main())
    config = FLEET.model_copy(update={"rounds": ROUNDS})
    simulated = Simulation(config, "defkt", provision(config)).run()
    assert digests == {n.id: n.param_sha256 for n in simulated.nodes}
    assert virtual > 0


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
